/* A TCP stream with every byte checked, for programs run over rsockets (issue 40): iperf has
 * no data check of its own. The client sends BYTES bytes of a position-dependent pattern in
 * writes of varying sizes (1 B .. 64 KiB); the server checks each byte as it arrives and
 * answers with the count it checked and the number of bad bytes; both print "OK stream".
 *   rsocket_check server ADDR PORT BYTES
 *   rsocket_check client ADDR PORT BYTES [SOURCE_ADDR]
 * Plain blocking socket calls only (socket, bind, listen, accept, connect, read, write,
 * close), so the same binary runs over kernel TCP and, preloaded, over rsockets. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static unsigned char pat(uint64_t i) { return (unsigned char)(i * 31 + (i >> 12) + 7); }

static struct sockaddr_in addr_of(const char *ip, int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", ip);
        exit(2);
    }
    return a;
}

static int full(int fd, void *buf, size_t n, int wr) {
    size_t d = 0;
    while (d < n) {
        ssize_t r = wr ? write(fd, (char *)buf + d, n - d) : read(fd, (char *)buf + d, n - d);
        if (r <= 0) return -1;
        d += (size_t)r;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s server|client ADDR PORT BYTES [SOURCE]\n", argv[0]);
        return 2;
    }
    struct sockaddr_in a = addr_of(argv[2], atoi(argv[3]));
    uint64_t total = strtoull(argv[4], NULL, 0);
    static unsigned char buf[65536];
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) { perror("socket"); return 1; }
    if (!strcmp(argv[1], "server")) {
        int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1)) { perror("bind/listen"); return 1; }
        printf("listening on %s:%s\n", argv[2], argv[3]);
        fflush(stdout);
        int c = accept(s, NULL, NULL);
        if (c < 0) { perror("accept"); return 1; }
        uint64_t got = 0, bad = 0;
        while (got < total) {
            size_t want = total - got < sizeof buf ? (size_t)(total - got) : sizeof buf;
            ssize_t r = read(c, buf, want);
            if (r <= 0) { fprintf(stderr, "read after %llu bytes: %zd\n", (unsigned long long)got, r); return 1; }
            for (ssize_t i = 0; i < r; i++)
                if (buf[i] != pat(got + (uint64_t)i)) {
                    if (!bad) fprintf(stderr, "first bad byte at %llu\n", (unsigned long long)(got + (uint64_t)i));
                    bad++;
                }
            got += (uint64_t)r;
        }
        uint64_t reply[2] = {got, bad};
        if (full(c, reply, sizeof reply, 1)) { perror("write reply"); return 1; }
        printf("%s stream: %llu bytes checked, %llu bad\n", bad ? "BAD" : "OK", (unsigned long long)got, (unsigned long long)bad);
        close(c);
        close(s);
        return bad ? 1 : 0;
    }
    if (argc > 5) {
        struct sockaddr_in src = addr_of(argv[5], 0);
        if (bind(s, (struct sockaddr *)&src, sizeof src)) { perror("bind source"); return 1; }
    }
    if (connect(s, (struct sockaddr *)&a, sizeof a)) { perror("connect"); return 1; }
    uint64_t sent = 0;
    size_t step = 1;
    while (sent < total) {
        size_t n = step < sizeof buf ? step : sizeof buf;
        if (n > total - sent) n = (size_t)(total - sent);
        for (size_t i = 0; i < n; i++) buf[i] = pat(sent + i);
        if (full(s, buf, n, 1)) { perror("write"); return 1; }
        sent += n;
        step = step * 3 + 1; /* 1, 4, 13, ... 65536 then wrap */
        if (step > sizeof buf) step = 1;
    }
    uint64_t reply[2];
    if (full(s, reply, sizeof reply, 0)) { perror("read reply"); return 1; }
    int ok = reply[0] == total && reply[1] == 0;
    printf("%s stream: sent %llu, server checked %llu, %llu bad\n", ok ? "OK" : "BAD", (unsigned long long)sent,
           (unsigned long long)reply[0], (unsigned long long)reply[1]);
    close(s);
    return ok ? 0 : 1;
}

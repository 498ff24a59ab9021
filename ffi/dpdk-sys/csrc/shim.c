/* See shim.h. Compiled with exactly the cflags of `pkg-config --cflags libdpdk`. */
#include <rte_config.h>
#include <rte_cycles.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_pause.h>
#include "shim.h"

uint16_t pmrxe_eth_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **rx_pkts, uint16_t nb_pkts)
{ return rte_eth_rx_burst(port_id, queue_id, rx_pkts, nb_pkts); }
uint16_t pmrxe_eth_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **tx_pkts, uint16_t nb_pkts)
{ return rte_eth_tx_burst(port_id, queue_id, tx_pkts, nb_pkts); }
struct rte_mbuf *pmrxe_pktmbuf_alloc(struct rte_mempool *mp) { return rte_pktmbuf_alloc(mp); }
int pmrxe_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int count)
{ return rte_pktmbuf_alloc_bulk(mp, mbufs, count); }
void pmrxe_pktmbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }
void pmrxe_pktmbuf_free_bulk(struct rte_mbuf **mbufs, unsigned int count) { rte_pktmbuf_free_bulk(mbufs, count); }
char *pmrxe_pktmbuf_append(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_append(m, len); }
int pmrxe_pktmbuf_trim(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_trim(m, len); }
char *pmrxe_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_prepend(m, len); }
char *pmrxe_pktmbuf_adj(struct rte_mbuf *m, uint16_t len) { return rte_pktmbuf_adj(m, len); }
void *pmrxe_pktmbuf_mtod(struct rte_mbuf *m) { return rte_pktmbuf_mtod(m, void *); }
uint16_t pmrxe_pktmbuf_data_len(const struct rte_mbuf *m) { return rte_pktmbuf_data_len(m); }
uint32_t pmrxe_pktmbuf_pkt_len(const struct rte_mbuf *m) { return rte_pktmbuf_pkt_len(m); }
uint16_t pmrxe_pktmbuf_tailroom(const struct rte_mbuf *m) { return rte_pktmbuf_tailroom(m); }
uint16_t pmrxe_pktmbuf_headroom(const struct rte_mbuf *m) { return rte_pktmbuf_headroom(m); }
void pmrxe_pktmbuf_reset(struct rte_mbuf *m) { rte_pktmbuf_reset(m); }
int pmrxe_errno(void) { return rte_errno; }
uint64_t pmrxe_rdtsc(void) { return rte_rdtsc(); }
uint64_t pmrxe_get_tsc_hz(void) { return rte_get_tsc_hz(); }
unsigned int pmrxe_lcore_id(void) { return rte_lcore_id(); }
void pmrxe_pause(void) { rte_pause(); }

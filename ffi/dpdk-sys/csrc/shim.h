/* Out-of-line wrappers for DPDK's static-inline / macro fast path.
 * bindgen does not emit static inlines; these give them a linkable symbol.
 * Every function is a one-line forward; no logic lives here. */
#ifndef PMRXE_DPDK_SHIM_H
#define PMRXE_DPDK_SHIM_H
#include <stdint.h>
#include <rte_ethdev.h>
#include <rte_mbuf.h>

uint16_t pmrxe_eth_rx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **rx_pkts, uint16_t nb_pkts);
uint16_t pmrxe_eth_tx_burst(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **tx_pkts, uint16_t nb_pkts);
struct rte_mbuf *pmrxe_pktmbuf_alloc(struct rte_mempool *mp);
int pmrxe_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int count);
void pmrxe_pktmbuf_free(struct rte_mbuf *m);
/* Free `count` mbufs (whole chains) at once: one mempool put per pool run, not per mbuf. */
void pmrxe_pktmbuf_free_bulk(struct rte_mbuf **mbufs, unsigned int count);
char *pmrxe_pktmbuf_append(struct rte_mbuf *m, uint16_t len);
int pmrxe_pktmbuf_trim(struct rte_mbuf *m, uint16_t len);
char *pmrxe_pktmbuf_prepend(struct rte_mbuf *m, uint16_t len);
char *pmrxe_pktmbuf_adj(struct rte_mbuf *m, uint16_t len);
void *pmrxe_pktmbuf_mtod(struct rte_mbuf *m);
uint16_t pmrxe_pktmbuf_data_len(const struct rte_mbuf *m);
uint32_t pmrxe_pktmbuf_pkt_len(const struct rte_mbuf *m);
uint16_t pmrxe_pktmbuf_tailroom(const struct rte_mbuf *m);
uint16_t pmrxe_pktmbuf_headroom(const struct rte_mbuf *m);
void pmrxe_pktmbuf_reset(struct rte_mbuf *m);
int pmrxe_errno(void);
uint64_t pmrxe_rdtsc(void);
uint64_t pmrxe_get_tsc_hz(void);
unsigned int pmrxe_lcore_id(void);
void pmrxe_pause(void);
#endif

/* pmrxedv.h - pmrxe direct-verbs extension: fast memory registration from userspace.
 *
 * Userspace verbs have no IB_WR_REG_MR; pmrxe adds one in the spirit of mlx5dv. The model is
 * the kernel's (ib_alloc_mr / ib_map_mr_sg / ib_update_fast_reg_key / IB_WR_REG_MR /
 * IB_WR_LOCAL_INV):
 *
 *   mr = pmrxedv_alloc_mr(pd, max_num_sg);          // an MR in the FREE state, no rights
 *   n  = pmrxedv_map_mr_sg(mr, sg, nsg, &off, 4096);// stage a page list (mr->addr = iova)
 *   pmrxedv_update_fast_reg_key(mr, ++key_byte);    // new 8-bit key in mr->lkey/rkey
 *   pmrxedv_post_reg_mr(qp, wr_id, mr, access, IBV_SEND_SIGNALED);
 *        ... peers use mr->rkey at mr->addr ...
 *   pmrxedv_post_local_inv(qp, wr_id, mr->rkey, IBV_SEND_SIGNALED);
 *
 * REG_MR and LOCAL_INV are send-queue operations: they execute exactly once, in SQ order, and
 * LOCAL_INV waits for every earlier WQE (DESIGN.md invariants 1-3). Re-posting REG_MR without
 * a new map re-validates the existing translation. Memory passed to map_mr_sg is made shared
 * with the service the same way ibv_reg_mr does it (README.md).
 *
 * Link with -lpmrxe_verbs (or run under `pmrxe run --`, which preloads the library).
 */
#ifndef PMRXEDV_H
#define PMRXEDV_H

#include <stdint.h>
#include <infiniband/verbs.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The pmrxe extension opcode carried in the send queue (informational). */
#define PMRXEDV_WR_REG_MR 0x100

/* An async event pmrxe adds to enum ibv_event_type (ibv_get_async_event): the service revoked
 * an MR because the memory behind it faulted (its file was truncated or had a hole punched);
 * event.element.port_num holds the MR's lkey. Every later use of the MR fails with a local
 * protection or remote access error. Acknowledge it like any other event. */
#define PMRXEDV_EVENT_MR_REVOKED 0x2001

/* Allocate a fast-registration MR with room for max_num_sg pages. NULL + errno on failure. */
struct ibv_mr *pmrxedv_alloc_mr(struct ibv_pd *pd, uint32_t max_num_sg);

/* Map sg_nents scatter entries (addr, length; lkey ignored) into the MR's staging page list,
 * starting *sg_offset bytes into the first entry (sg_offset may be NULL). Entries after the
 * first must start, and entries before the last must end, on a page_size boundary.
 * Returns the number of entries mapped, or a negative errno. On success mr->addr is the
 * iova (first address + offset) and mr->length the mapped length. */
int pmrxedv_map_mr_sg(struct ibv_mr *mr, const struct ibv_sge *sg_list, int sg_nents,
		      unsigned int *sg_offset, unsigned int page_size);

/* Replace the low 8 bits (the key) of mr->lkey and mr->rkey. Takes effect at the next REG_MR. */
void pmrxedv_update_fast_reg_key(struct ibv_mr *mr, uint8_t key_byte);

/* Post REG_MR: install the staged translation with rights `access` (IBV_ACCESS_*) under the
 * current mr->rkey. send_flags: IBV_SEND_SIGNALED / IBV_SEND_FENCE. Returns 0 or an errno. */
int pmrxedv_post_reg_mr(struct ibv_qp *qp, uint64_t wr_id, struct ibv_mr *mr,
			unsigned int access, unsigned int send_flags);

/* Post LOCAL_INV of `key` (an MR or MW key). Returns 0 or an errno. */
int pmrxedv_post_local_inv(struct ibv_qp *qp, uint64_t wr_id, uint32_t key, unsigned int send_flags);

#ifdef __cplusplus
}
#endif
#endif /* PMRXEDV_H */

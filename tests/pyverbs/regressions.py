#!/usr/bin/python3
"""Regression tests for verbs-conformance bugs (issue 13), through Debian's pyverbs.

Run by tests/verbs_regressions.rs as `pmrxe run -- /usr/bin/python3 -m unittest -v ...` against
a private service on the loopback config; each test is named after the bug it pins. Written for
pmrxe (rdma-core's own suite runs separately, unmodified: scripts/rdma-core-tests.sh).
"""
import errno
import os
import time
import unittest

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute, AH
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr, QPInitAttrEx, QPEx
from pyverbs.wr import RecvWR, SendWR, SGE

DEV = os.environ.get("PMRXE_DEV", "pmrxe0")
PORT = 1
GID = 1


class Verbs(unittest.TestCase):
    def setUp(self):
        self.ctx = Context(name=DEV)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 64, None, None, 0)
        self.mr = MR(self.pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
                     e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)

    def tearDown(self):
        for o in (self.mr, self.cq, self.pd, self.ctx):
            o.close()

    def rc_qp(self, max_recv_wr=4):
        cap = QPCap(max_send_wr=8, max_recv_wr=max_recv_wr, max_send_sge=2, max_recv_sge=2)
        return QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))

    def global_attr(self, qp):
        gid = self.ctx.query_gid(PORT, GID)
        a = QPAttr(port_num=PORT)
        a.dest_qp_num = qp.qp_num
        a.path_mtu = e.IBV_MTU_1024
        a.max_dest_rd_atomic = 1
        a.max_rd_atomic = 1
        a.ah_attr = AHAttr(port_num=PORT, is_global=1, gr=GlobalRoute(dgid=gid, sgid_index=GID))
        a.qp_access_flags = e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_ATOMIC
        return a

    def send_wr(self, opcode=e.IBV_WR_SEND, length=8):
        return SendWR(opcode=opcode, num_sge=1, sg=[SGE(self.mr.buf, length, self.mr.lkey)])

    def assert_errno(self, code, fn, *args):
        with self.assertRaises(PyverbsRDMAError) as ex:
            fn(*args)
        self.assertEqual(ex.exception.error_code, code, str(ex.exception))

    # Issue 13 item 2: WRs that vanished instead of failing at post time.
    def test_post_send_in_reset_init_rtr_is_einval(self):
        qp = self.rc_qp()
        self.assert_errno(errno.EINVAL, qp.post_send, self.send_wr())
        qp.to_init(self.global_attr(qp))
        self.assert_errno(errno.EINVAL, qp.post_send, self.send_wr())
        qp.to_rtr(self.global_attr(qp))
        self.assert_errno(errno.EINVAL, qp.post_send, self.send_wr())

    def test_post_recv_in_reset_is_einval(self):
        qp = self.rc_qp()
        wr = RecvWR(num_sge=1, sg=[SGE(self.mr.buf, 64, self.mr.lkey)])
        self.assert_errno(errno.EINVAL, qp.post_recv, wr)
        qp.to_init(self.global_attr(qp))
        qp.post_recv(wr)  # INIT accepts receives

    def test_atomic_unaligned_or_short_sge_is_einval_at_post(self):
        qp = self.rc_qp()
        qp.to_rts(self.global_attr(qp))
        for addr_off, length in ((1, 8), (0, 4)):
            wr = self.send_wr(e.IBV_WR_ATOMIC_FETCH_AND_ADD, length)
            wr.set_wr_atomic(rkey=self.mr.rkey, addr=self.mr.buf + addr_off, compare_add=1, swap=0)
            self.assert_errno(errno.EINVAL, qp.post_send, wr)

    # Item 4: validation as the kernel providers do it.
    def test_rtr_without_grh_on_roce_is_einval(self):
        qp = self.rc_qp()
        qp.to_init(self.global_attr(qp))
        a = self.global_attr(qp)
        a.ah_attr = AHAttr(port_num=PORT, is_global=0)
        self.assert_errno(errno.EINVAL, qp.to_rtr, a)

    def test_ah_without_grh_on_roce_is_einval(self):
        self.assert_errno(errno.EINVAL, lambda: AH(self.pd, attr=AHAttr(port_num=PORT, is_global=0)))

    def test_create_qp_ex_accepts_create_flags_zero(self):
        cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
        qia = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, pd=self.pd, cap=cap,
                           comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_CREATE_FLAGS,
                           create_flags=0)
        QP(self.ctx, qia).close()

    def test_create_qp_ex_refuses_atomic_write_send_op(self):
        cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
        qia = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, pd=self.pd, cap=cap,
                           send_ops_flags=e.IBV_QP_EX_WITH_ATOMIC_WRITE,
                           comp_mask=e.IBV_QP_INIT_ATTR_PD | e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
        self.assert_errno(errno.EOPNOTSUPP, QPEx, self.ctx, qia)

    def test_comp_vector_beyond_num_comp_vectors_is_einval(self):
        self.assert_errno(errno.EINVAL, CQ, self.ctx, 8, None, None, self.ctx.num_comp_vectors)

    def test_rq_accepts_exactly_the_reported_max_recv_wr(self):
        for asked in (1, 3, 10):
            qp = self.rc_qp(max_recv_wr=asked)
            cap = qp.query(e.IBV_QP_CAP)[0].cap
            qp.to_init(self.global_attr(qp))
            wr = RecvWR(num_sge=1, sg=[SGE(self.mr.buf, 64, self.mr.lkey)])
            for _ in range(cap.max_recv_wr):
                qp.post_recv(wr)
            self.assert_errno(errno.ENOMEM, qp.post_recv, wr)
            qp.close()

    def test_vendor_id_is_not_zero(self):
        self.assertNotEqual(self.ctx.query_device().vendor_id, 0)

    # Item 3: calls that crashed inside libibverbs on a pmrxe context.
    def test_query_gid_table_and_data_in_order_do_not_crash(self):
        n = self.ctx.query_port(PORT).gid_tbl_len
        entries = self.ctx.query_gid_table(n)
        self.assertTrue(any(g.gid_index == GID for g in entries))
        # ibv_query_gid_table returns -errno; pyverbs passes it on as is.
        self.assert_errno(-errno.EINVAL, self.ctx.query_gid_table, 0)
        qp = self.rc_qp()
        self.assertIn(qp.query_data_in_order(e.IBV_WR_SEND), [0, 1])

    # Item 8: rereg that changes only access or PD keeps the keys.
    def test_rereg_access_and_pd_keep_the_keys(self):
        lkey, rkey = self.mr.lkey, self.mr.rkey
        self.mr.rereg(e.IBV_REREG_MR_CHANGE_ACCESS, None, 0, 0,
                      e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_READ)
        self.assertEqual((self.mr.lkey, self.mr.rkey), (lkey, rkey))
        pd2 = PD(self.ctx)
        self.mr.rereg(e.IBV_REREG_MR_CHANGE_PD, pd2, 0, 0, 0)
        self.assertEqual((self.mr.lkey, self.mr.rkey), (lkey, rkey))
        self.mr.rereg(e.IBV_REREG_MR_CHANGE_PD, self.pd, 0, 0, 0)

    def test_destroy_qp_drops_its_completions_from_the_cq(self):
        # libfabric's rxm frees its receive buffers once the QP is destroyed and may poll the CQ
        # again: a flush completion left behind handed fi_pingpong -e rdm a freed wr_id (a crash
        # in about 1 run in 20). mlx5 removes a destroyed QP's completions; so must we.
        gone, kept = self.rc_qp(), self.rc_qp()
        for qp in (gone, kept):
            qp.to_init(self.global_attr(qp))
            for i in range(2):
                qp.post_recv(RecvWR(wr_id=i, num_sge=1, sg=[SGE(self.mr.buf, 8, self.mr.lkey)]))
            qp.modify(QPAttr(qp_state=e.IBV_QPS_ERR), e.IBV_QP_STATE)
        gone_qpn, kept_qpn = gone.qp_num, kept.qp_num
        time.sleep(0.2)  # the service flushes both QPs' receive WQEs into the shared CQ
        gone.close()
        wcs = []
        deadline = time.monotonic() + 5
        while len(wcs) < 2 and time.monotonic() < deadline:
            wcs += self.cq.poll(8)[1]
        time.sleep(0.1)
        wcs += self.cq.poll(8)[1]
        self.assertEqual(sorted((wc.qp_num, wc.wr_id, wc.status) for wc in wcs),
                         [(kept_qpn, 0, e.IBV_WC_WR_FLUSH_ERR), (kept_qpn, 1, e.IBV_WC_WR_FLUSH_ERR)])
        self.assertNotIn(gone_qpn, [wc.qp_num for wc in wcs])
        kept.close()


if __name__ == "__main__":
    unittest.main()

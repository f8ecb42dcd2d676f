#!/usr/bin/python3
# pyverbs (Debian's python3-pyverbs, unmodified) on softrnic: open the device, create
# PD/MR/CQ/QPs, connect two RC QPs on loopback, and run SEND, RDMA WRITE, RDMA READ and both
# atomics (and ATOMIC_WRITE through QPEx), checking memory byte for byte. Run with the shim
# first on LD_LIBRARY_PATH.
import struct
import sys
import time
import unittest

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context, get_device_list
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPEx, QPInitAttr, QPInitAttrEx
from pyverbs.wr import SGE, RecvWR, SendWR

DEV = 'softrnic0'
ACCESS = (e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE |
          e.IBV_ACCESS_REMOTE_READ | e.IBV_ACCESS_REMOTE_ATOMIC)


def poll_one(cq, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        n, wcs = cq.poll()
        if n > 0:
            return wcs[0]
    raise AssertionError('no completion within %.0fs' % timeout)


class Side:
    """One endpoint: its own context (and so its own softrnic device address)."""

    def __init__(self, size=4096, send_ops_flags=0):
        self.ctx = Context(name=DEV)
        self.pd = PD(self.ctx)
        self.cq = CQ(self.ctx, 64)
        self.mr = MR(self.pd, size, ACCESS)
        cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
        if send_ops_flags:
            # The extended QP, as rdma-core's test_qpex.py creates it.
            attr = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap,
                                pd=self.pd, send_ops_flags=send_ops_flags,
                                comp_mask=e.IBV_QP_INIT_ATTR_PD |
                                e.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)
            self.qp = QPEx(self.ctx, attr)
        else:
            self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                             cap=cap))
        self.gid = self.ctx.query_gid(1, 0)

    def connect(self, peer):
        gr = GlobalRoute(dgid=peer.gid, sgid_index=0, hop_limit=64)
        ah = AHAttr(gr=gr, is_global=1, port_num=1)
        attr = QPAttr(qp_state=e.IBV_QPS_RTS, cur_qp_state=e.IBV_QPS_RESET, port_num=1)
        attr.qp_access_flags = ACCESS
        attr.path_mtu = e.IBV_MTU_1024
        attr.dest_qp_num = peer.qp.qp_num
        attr.rq_psn = 0
        attr.sq_psn = 0
        attr.max_dest_rd_atomic = 4
        attr.max_rd_atomic = 4
        attr.min_rnr_timer = 1
        attr.timeout = 14
        attr.retry_cnt = 7
        attr.rnr_retry = 7
        attr.ah_attr = ah
        self.qp.to_rts(attr)


class PyverbsOnSoftrnic(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.a = Side()
        cls.b = Side()
        cls.a.connect(cls.b)
        cls.b.connect(cls.a)

    def test_device_listed_and_attributes(self):
        names = [d.name.decode() for d in get_device_list()]
        self.assertIn(DEV, names)
        attr = self.a.ctx.query_device()
        self.assertGreater(attr.max_qp, 0)
        self.assertEqual(attr.phys_port_cnt, 1)
        port = self.a.ctx.query_port(1)
        self.assertEqual(port.state, e.IBV_PORT_ACTIVE)
        self.assertTrue(str(self.a.gid).startswith('0000:0000:0000:0000:0000:ffff:7f00:'))
        self.assertEqual(self.a.qp.qp_state, e.IBV_QPS_RTS)

    def test_send(self):
        a, b = self.a, self.b
        b.mr.write(b'\0' * 64, 64)
        b.qp.post_recv(RecvWR(wr_id=7, num_sge=1, sg=[SGE(b.mr.buf, 64, b.mr.lkey)]))
        msg = b'softrnic pyverbs send!'
        a.mr.write(msg, len(msg))
        a.qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, num_sge=1,
                              sg=[SGE(a.mr.buf, len(msg), a.mr.lkey)],
                              send_flags=e.IBV_SEND_SIGNALED))
        wc = poll_one(a.cq)
        self.assertEqual(wc.status, e.IBV_WC_SUCCESS)
        self.assertEqual(wc.opcode, e.IBV_WC_SEND)
        wc = poll_one(b.cq)
        self.assertEqual(wc.status, e.IBV_WC_SUCCESS)
        self.assertEqual(wc.opcode, e.IBV_WC_RECV)
        self.assertEqual(wc.wr_id, 7)
        self.assertEqual(wc.byte_len, len(msg))
        self.assertEqual(b.mr.read(len(msg), 0), msg)

    def test_rdma_write(self):
        a, b = self.a, self.b
        data = bytes(range(256)) * 4
        a.mr.write(data, len(data))
        b.mr.write(b'\0' * len(data), len(data))
        wr = SendWR(wr_id=2, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                    sg=[SGE(a.mr.buf, len(data), a.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
        a.qp.post_send(wr)
        wc = poll_one(a.cq)
        self.assertEqual(wc.status, e.IBV_WC_SUCCESS)
        self.assertEqual(wc.opcode, e.IBV_WC_RDMA_WRITE)
        self.assertEqual(b.mr.read(len(data), 0), data)

    def test_rdma_read(self):
        a, b = self.a, self.b
        data = b'read-me-' * 100
        b.mr.write(data, len(data))
        a.mr.write(b'\0' * len(data), len(data))
        wr = SendWR(wr_id=3, opcode=e.IBV_WR_RDMA_READ, num_sge=1,
                    sg=[SGE(a.mr.buf, len(data), a.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(b.mr.rkey, b.mr.buf)
        a.qp.post_send(wr)
        wc = poll_one(a.cq)
        self.assertEqual(wc.status, e.IBV_WC_SUCCESS)
        self.assertEqual(wc.opcode, e.IBV_WC_RDMA_READ)
        self.assertEqual(wc.byte_len, len(data))
        self.assertEqual(a.mr.read(len(data), 0), data)

    def test_atomics(self):
        a, b = self.a, self.b
        b.mr.write(struct.pack('<Q', 100), 8)  # target (host order = little endian here)
        a.mr.write(b'\0' * 8, 8)
        wr = SendWR(wr_id=4, opcode=e.IBV_WR_ATOMIC_FETCH_AND_ADD, num_sge=1,
                    sg=[SGE(a.mr.buf, 8, a.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_atomic(b.mr.rkey, b.mr.buf, 5, 0)
        a.qp.post_send(wr)
        wc = poll_one(a.cq)
        self.assertEqual(wc.status, e.IBV_WC_SUCCESS)
        self.assertEqual(wc.opcode, e.IBV_WC_FETCH_ADD)
        self.assertEqual(struct.unpack('<Q', a.mr.read(8, 0))[0], 100)
        self.assertEqual(struct.unpack('<Q', b.mr.read(8, 0))[0], 105)
        wr = SendWR(wr_id=5, opcode=e.IBV_WR_ATOMIC_CMP_AND_SWP, num_sge=1,
                    sg=[SGE(a.mr.buf, 8, a.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_atomic(b.mr.rkey, b.mr.buf, 105, 7)
        a.qp.post_send(wr)
        wc = poll_one(a.cq)
        self.assertEqual(wc.status, e.IBV_WC_SUCCESS)
        self.assertEqual(wc.opcode, e.IBV_WC_COMP_SWAP)
        self.assertEqual(struct.unpack('<Q', a.mr.read(8, 0))[0], 105)
        self.assertEqual(struct.unpack('<Q', b.mr.read(8, 0))[0], 7)

    def test_qp_ex_atomic_write(self):
        # rdma-core 44 test_qpex.py test_qp_ex_rc_atomic_write: QPEx.wr_atomic_write.
        c = Side(send_ops_flags=e.IBV_QP_EX_WITH_ATOMIC_WRITE)
        d = Side(send_ops_flags=e.IBV_QP_EX_WITH_ATOMIC_WRITE)
        c.connect(d)
        d.connect(c)
        d.mr.write(b'\0' * 16, 16)
        value = b'8bytes!!'
        c.qp.wr_start()
        c.qp.wr_id = 9
        c.qp.wr_flags = e.IBV_SEND_SIGNALED
        c.qp.wr_atomic_write(d.mr.rkey, d.mr.buf + 8, value)
        c.qp.wr_complete()
        wc = poll_one(c.cq)
        self.assertEqual(wc.status, e.IBV_WC_SUCCESS)
        self.assertEqual(wc.opcode, e.IBV_WC_ATOMIC_WRITE)
        self.assertEqual(d.mr.read(16, 0), b'\0' * 8 + value)

    def test_bad_rkey_is_remote_access_error(self):
        # A separate QP pair: the error moves both QPs to ERR (IBA 10.7.3.1).
        c, d = Side(), Side()
        c.connect(d)
        d.connect(c)
        wr = SendWR(wr_id=6, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1,
                    sg=[SGE(c.mr.buf, 16, c.mr.lkey)], send_flags=e.IBV_SEND_SIGNALED)
        wr.set_wr_rdma(d.mr.rkey ^ 0x80, d.mr.buf)
        c.qp.post_send(wr)
        wc = poll_one(c.cq)
        self.assertEqual(wc.status, e.IBV_WC_REM_ACCESS_ERR)


if __name__ == '__main__':
    unittest.main(verbosity=2)

// tests/emu/types_mirror_test.cc: the numeric-mirroring guarantee of emu/objects/types.h. This test
// (not emu/) includes rdma-core's <infiniband/verbs.h> and checks every mirrored value at
// compile time, and the Sge layout the shim may reinterpret_cast.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstddef>

#include "emu/objects/types.h"
#include "emu/objects/wqe.h"

namespace rnic::emu {
namespace {

template <class E>
constexpr int v(E e) {
  return static_cast<int>(e);
}

#define SAME(a, b) static_assert(v(a) == static_cast<int>(b), #a " != " #b)

SAME(QpType::kRc, IBV_QPT_RC);
SAME(QpType::kUc, IBV_QPT_UC);
SAME(QpType::kUd, IBV_QPT_UD);

SAME(QpState::kReset, IBV_QPS_RESET);
SAME(QpState::kInit, IBV_QPS_INIT);
SAME(QpState::kRtr, IBV_QPS_RTR);
SAME(QpState::kRts, IBV_QPS_RTS);
SAME(QpState::kSqd, IBV_QPS_SQD);
SAME(QpState::kSqe, IBV_QPS_SQE);
SAME(QpState::kErr, IBV_QPS_ERR);
SAME(QpState::kUnknown, IBV_QPS_UNKNOWN);
SAME(MigState::kMigrated, IBV_MIG_MIGRATED);
SAME(MigState::kRearm, IBV_MIG_REARM);
SAME(MigState::kArmed, IBV_MIG_ARMED);

SAME(WcStatus::kSuccess, IBV_WC_SUCCESS);
SAME(WcStatus::kLocLenErr, IBV_WC_LOC_LEN_ERR);
SAME(WcStatus::kLocQpOpErr, IBV_WC_LOC_QP_OP_ERR);
SAME(WcStatus::kLocEecOpErr, IBV_WC_LOC_EEC_OP_ERR);
SAME(WcStatus::kLocProtErr, IBV_WC_LOC_PROT_ERR);
SAME(WcStatus::kWrFlushErr, IBV_WC_WR_FLUSH_ERR);
SAME(WcStatus::kMwBindErr, IBV_WC_MW_BIND_ERR);
SAME(WcStatus::kBadRespErr, IBV_WC_BAD_RESP_ERR);
SAME(WcStatus::kLocAccessErr, IBV_WC_LOC_ACCESS_ERR);
SAME(WcStatus::kRemInvReqErr, IBV_WC_REM_INV_REQ_ERR);
SAME(WcStatus::kRemAccessErr, IBV_WC_REM_ACCESS_ERR);
SAME(WcStatus::kRemOpErr, IBV_WC_REM_OP_ERR);
SAME(WcStatus::kRetryExcErr, IBV_WC_RETRY_EXC_ERR);
SAME(WcStatus::kRnrRetryExcErr, IBV_WC_RNR_RETRY_EXC_ERR);
SAME(WcStatus::kLocRddViolErr, IBV_WC_LOC_RDD_VIOL_ERR);
SAME(WcStatus::kRemInvRdReqErr, IBV_WC_REM_INV_RD_REQ_ERR);
SAME(WcStatus::kRemAbortErr, IBV_WC_REM_ABORT_ERR);
SAME(WcStatus::kInvEecnErr, IBV_WC_INV_EECN_ERR);
SAME(WcStatus::kInvEecStateErr, IBV_WC_INV_EEC_STATE_ERR);
SAME(WcStatus::kFatalErr, IBV_WC_FATAL_ERR);
SAME(WcStatus::kRespTimeoutErr, IBV_WC_RESP_TIMEOUT_ERR);
SAME(WcStatus::kGeneralErr, IBV_WC_GENERAL_ERR);
SAME(WcStatus::kTmErr, IBV_WC_TM_ERR);
SAME(WcStatus::kTmRndvIncomplete, IBV_WC_TM_RNDV_INCOMPLETE);

SAME(WcOpcode::kSend, IBV_WC_SEND);
SAME(WcOpcode::kRdmaWrite, IBV_WC_RDMA_WRITE);
SAME(WcOpcode::kRdmaRead, IBV_WC_RDMA_READ);
SAME(WcOpcode::kCompSwap, IBV_WC_COMP_SWAP);
SAME(WcOpcode::kFetchAdd, IBV_WC_FETCH_ADD);
SAME(WcOpcode::kBindMw, IBV_WC_BIND_MW);
SAME(WcOpcode::kLocalInv, IBV_WC_LOCAL_INV);
SAME(WcOpcode::kTso, IBV_WC_TSO);
SAME(WcOpcode::kAtomicWrite, IBV_WC_ATOMIC_WRITE);
SAME(WcOpcode::kRecv, IBV_WC_RECV);
SAME(WcOpcode::kRecvRdmaWithImm, IBV_WC_RECV_RDMA_WITH_IMM);
SAME(WcOpcode::kTmAdd, IBV_WC_TM_ADD);
SAME(WcOpcode::kTmDel, IBV_WC_TM_DEL);
SAME(WcOpcode::kTmSync, IBV_WC_TM_SYNC);
SAME(WcOpcode::kTmRecv, IBV_WC_TM_RECV);
SAME(WcOpcode::kTmNoTag, IBV_WC_TM_NO_TAG);

SAME(WrOpcode::kRdmaWrite, IBV_WR_RDMA_WRITE);
SAME(WrOpcode::kRdmaWriteWithImm, IBV_WR_RDMA_WRITE_WITH_IMM);
SAME(WrOpcode::kSend, IBV_WR_SEND);
SAME(WrOpcode::kSendWithImm, IBV_WR_SEND_WITH_IMM);
SAME(WrOpcode::kRdmaRead, IBV_WR_RDMA_READ);
SAME(WrOpcode::kAtomicCmpAndSwp, IBV_WR_ATOMIC_CMP_AND_SWP);
SAME(WrOpcode::kAtomicFetchAndAdd, IBV_WR_ATOMIC_FETCH_AND_ADD);
SAME(WrOpcode::kLocalInv, IBV_WR_LOCAL_INV);
SAME(WrOpcode::kBindMw, IBV_WR_BIND_MW);
SAME(WrOpcode::kSendWithInv, IBV_WR_SEND_WITH_INV);
SAME(WrOpcode::kTso, IBV_WR_TSO);
SAME(WrOpcode::kDriver1, IBV_WR_DRIVER1);
SAME(WrOpcode::kAtomicWrite, IBV_WR_ATOMIC_WRITE);

static_assert(kAccessLocalWrite == IBV_ACCESS_LOCAL_WRITE);
static_assert(kAccessRemoteWrite == IBV_ACCESS_REMOTE_WRITE);
static_assert(kAccessRemoteRead == IBV_ACCESS_REMOTE_READ);
static_assert(kAccessRemoteAtomic == IBV_ACCESS_REMOTE_ATOMIC);
static_assert(kAccessMwBind == IBV_ACCESS_MW_BIND);
static_assert(kAccessZeroBased == IBV_ACCESS_ZERO_BASED);
static_assert(kAccessOnDemand == IBV_ACCESS_ON_DEMAND);
static_assert(kAccessHugetlb == IBV_ACCESS_HUGETLB);
static_assert(kAccessRelaxedOrdering == IBV_ACCESS_RELAXED_ORDERING);
static_assert(kAccessOptionalRange == IBV_ACCESS_OPTIONAL_RANGE);

static_assert(kQpState == IBV_QP_STATE);
static_assert(kQpCurState == IBV_QP_CUR_STATE);
static_assert(kQpEnSqdAsyncNotify == IBV_QP_EN_SQD_ASYNC_NOTIFY);
static_assert(kQpAccessFlags == IBV_QP_ACCESS_FLAGS);
static_assert(kQpPkeyIndex == IBV_QP_PKEY_INDEX);
static_assert(kQpPort == IBV_QP_PORT);
static_assert(kQpQkey == IBV_QP_QKEY);
static_assert(kQpAv == IBV_QP_AV);
static_assert(kQpPathMtu == IBV_QP_PATH_MTU);
static_assert(kQpTimeout == IBV_QP_TIMEOUT);
static_assert(kQpRetryCnt == IBV_QP_RETRY_CNT);
static_assert(kQpRnrRetry == IBV_QP_RNR_RETRY);
static_assert(kQpRqPsn == IBV_QP_RQ_PSN);
static_assert(kQpMaxQpRdAtomic == IBV_QP_MAX_QP_RD_ATOMIC);
static_assert(kQpAltPath == IBV_QP_ALT_PATH);
static_assert(kQpMinRnrTimer == IBV_QP_MIN_RNR_TIMER);
static_assert(kQpSqPsn == IBV_QP_SQ_PSN);
static_assert(kQpMaxDestRdAtomic == IBV_QP_MAX_DEST_RD_ATOMIC);
static_assert(kQpPathMigState == IBV_QP_PATH_MIG_STATE);
static_assert(kQpCap == IBV_QP_CAP);
static_assert(kQpDestQpn == IBV_QP_DEST_QPN);
static_assert(kQpRateLimit == IBV_QP_RATE_LIMIT);

static_assert(kSendFence == IBV_SEND_FENCE);
static_assert(kSendSignaled == IBV_SEND_SIGNALED);
static_assert(kSendSolicited == IBV_SEND_SOLICITED);
static_assert(kSendInline == IBV_SEND_INLINE);
static_assert(kSendIpCsum == IBV_SEND_IP_CSUM);

static_assert(kWcGrh == IBV_WC_GRH);
static_assert(kWcWithImm == IBV_WC_WITH_IMM);
static_assert(kWcIpCsumOk == IBV_WC_IP_CSUM_OK);
static_assert(kWcWithInv == IBV_WC_WITH_INV);
static_assert(kWcTmSyncReq == IBV_WC_TM_SYNC_REQ && kWcTmMatch == IBV_WC_TM_MATCH &&
              kWcTmDataValid == IBV_WC_TM_DATA_VALID);

static_assert(kReregChangeTranslation == IBV_REREG_MR_CHANGE_TRANSLATION);
static_assert(kReregChangePd == IBV_REREG_MR_CHANGE_PD);
static_assert(kReregChangeAccess == IBV_REREG_MR_CHANGE_ACCESS);
static_assert(kReregFlagsSupported == IBV_REREG_MR_FLAGS_SUPPORTED);
static_assert(kSrqMaxWr == IBV_SRQ_MAX_WR);
static_assert(kSrqLimit == IBV_SRQ_LIMIT);

SAME(EventType::kCqErr, IBV_EVENT_CQ_ERR);
SAME(EventType::kQpFatal, IBV_EVENT_QP_FATAL);
SAME(EventType::kQpReqErr, IBV_EVENT_QP_REQ_ERR);
SAME(EventType::kQpAccessErr, IBV_EVENT_QP_ACCESS_ERR);
SAME(EventType::kCommEst, IBV_EVENT_COMM_EST);
SAME(EventType::kSqDrained, IBV_EVENT_SQ_DRAINED);
SAME(EventType::kPathMig, IBV_EVENT_PATH_MIG);
SAME(EventType::kPathMigErr, IBV_EVENT_PATH_MIG_ERR);
SAME(EventType::kDeviceFatal, IBV_EVENT_DEVICE_FATAL);
SAME(EventType::kPortActive, IBV_EVENT_PORT_ACTIVE);
SAME(EventType::kPortErr, IBV_EVENT_PORT_ERR);
SAME(EventType::kLidChange, IBV_EVENT_LID_CHANGE);
SAME(EventType::kPkeyChange, IBV_EVENT_PKEY_CHANGE);
SAME(EventType::kSmChange, IBV_EVENT_SM_CHANGE);
SAME(EventType::kSrqErr, IBV_EVENT_SRQ_ERR);
SAME(EventType::kSrqLimitReached, IBV_EVENT_SRQ_LIMIT_REACHED);
SAME(EventType::kQpLastWqeReached, IBV_EVENT_QP_LAST_WQE_REACHED);
SAME(EventType::kClientReregister, IBV_EVENT_CLIENT_REREGISTER);
SAME(EventType::kGidChange, IBV_EVENT_GID_CHANGE);
SAME(EventType::kWqFatal, IBV_EVENT_WQ_FATAL);

SAME(Mtu::k256, IBV_MTU_256);
SAME(Mtu::k512, IBV_MTU_512);
SAME(Mtu::k1024, IBV_MTU_1024);
SAME(Mtu::k2048, IBV_MTU_2048);
SAME(Mtu::k4096, IBV_MTU_4096);
SAME(MwType::kType1, IBV_MW_TYPE_1);
SAME(MwType::kType2, IBV_MW_TYPE_2);
SAME(PortState::kNop, IBV_PORT_NOP);
SAME(PortState::kDown, IBV_PORT_DOWN);
SAME(PortState::kInit, IBV_PORT_INIT);
SAME(PortState::kArmed, IBV_PORT_ARMED);
SAME(PortState::kActive, IBV_PORT_ACTIVE);
SAME(PortState::kActiveDefer, IBV_PORT_ACTIVE_DEFER);
SAME(AtomicCap::kNone, IBV_ATOMIC_NONE);
SAME(AtomicCap::kHca, IBV_ATOMIC_HCA);
SAME(AtomicCap::kGlob, IBV_ATOMIC_GLOB);
SAME(GidType::kIb, IBV_GID_TYPE_IB);
SAME(GidType::kRoceV1, IBV_GID_TYPE_ROCE_V1);
SAME(GidType::kRoceV2, IBV_GID_TYPE_ROCE_V2);
static_assert(kLinkLayerEthernet == IBV_LINK_LAYER_ETHERNET);

static_assert(kDevCapResizeMaxWr == IBV_DEVICE_RESIZE_MAX_WR);
static_assert(kDevCapBadPkeyCntr == IBV_DEVICE_BAD_PKEY_CNTR);
static_assert(kDevCapBadQkeyCntr == IBV_DEVICE_BAD_QKEY_CNTR);
static_assert(kDevCapAutoPathMig == IBV_DEVICE_AUTO_PATH_MIG);
static_assert(kDevCapChangePhyPort == IBV_DEVICE_CHANGE_PHY_PORT);
static_assert(kDevCapUdAvPortEnforce == IBV_DEVICE_UD_AV_PORT_ENFORCE);
static_assert(kDevCapCurrQpStateMod == IBV_DEVICE_CURR_QP_STATE_MOD);
static_assert(kDevCapPortActiveEvent == IBV_DEVICE_PORT_ACTIVE_EVENT);
static_assert(kDevCapSysImageGuid == IBV_DEVICE_SYS_IMAGE_GUID);
static_assert(kDevCapRcRnrNakGen == IBV_DEVICE_RC_RNR_NAK_GEN);
static_assert(kDevCapSrqResize == IBV_DEVICE_SRQ_RESIZE);
static_assert(kDevCapNNotifyCq == IBV_DEVICE_N_NOTIFY_CQ);
static_assert(kDevCapMemWindow == IBV_DEVICE_MEM_WINDOW);
static_assert(kDevCapMemMgtExtensions == IBV_DEVICE_MEM_MGT_EXTENSIONS);
static_assert(kDevCapMemWindowType2B == IBV_DEVICE_MEM_WINDOW_TYPE_2B);

// Sge has ibv_sge's layout, so the shim may pass ibv_sge arrays straight through.
static_assert(sizeof(Sge) == sizeof(ibv_sge));
static_assert(offsetof(Sge, addr) == offsetof(ibv_sge, addr));
static_assert(offsetof(Sge, length) == offsetof(ibv_sge, length));
static_assert(offsetof(Sge, lkey) == offsetof(ibv_sge, lkey));

TEST(TypesMirror, StatusStringsAgreeWithRdmaCore) {
  // Run-time half: the names emu prints match libibverbs' own strings for statuses.
  EXPECT_EQ(v(WcStatus::kTmRndvIncomplete), IBV_WC_TM_RNDV_INCOMPLETE);
  EXPECT_STREQ(wc_status_name(WcStatus::kRemAccessErr), "REM_ACCESS_ERR");
  EXPECT_EQ(mtu_bytes(Mtu::k256), 256u);
  EXPECT_EQ(mtu_bytes(Mtu::k4096), 4096u);
  EXPECT_EQ(mtu_bytes(Mtu(0)), 0u);
}

}  // namespace
}  // namespace rnic::emu

// emu/objects/types.h: the verbs vocabulary of the soft-RNIC (QP types and states, WC status and
// opcodes, WR opcodes, access/attr-mask/send/wc flag bits, async events, MTU, MW types).
// NUMERIC GUARANTEE: every value here equals the value of the same-named constant in
// rdma-core 44's <infiniband/verbs.h> (which emu/ never includes). The shim static_asserts
// this and converts with a plain cast. Add new values; never renumber.
#pragma once

#include <cstdint>

namespace rnic::emu {

// ibv_qp_type (only the types softrnic implements).
enum class QpType : uint8_t {
  kRc = 2,  // IBV_QPT_RC
  kUc = 3,  // IBV_QPT_UC
  kUd = 4,  // IBV_QPT_UD
  kXrcSend = 9,   // IBV_QPT_XRC_SEND: XRC initiator (an RC requester, no receive side)
  kXrcRecv = 10,  // IBV_QPT_XRC_RECV: XRC target (an RC responder on an XRC domain, no SQ)
};
// RC and both XRC halves: acknowledged, PSN-sequenced, retransmitted (IBA 9.7).
constexpr bool is_reliable(QpType t) {
  return t == QpType::kRc || t == QpType::kXrcSend || t == QpType::kXrcRecv;
}
constexpr bool is_xrc(QpType t) { return t == QpType::kXrcSend || t == QpType::kXrcRecv; }

// ibv_qp_state.
enum class QpState : uint8_t {
  kReset = 0,
  kInit = 1,
  kRtr = 2,
  kRts = 3,
  kSqd = 4,
  kSqe = 5,
  kErr = 6,
  kUnknown = 7,
};
inline constexpr int kNumQpStates = 7;  // kReset..kErr

// ibv_mig_state.
enum class MigState : uint8_t { kMigrated = 0, kRearm = 1, kArmed = 2 };

// ibv_wc_status.
enum class WcStatus : uint8_t {
  kSuccess = 0,
  kLocLenErr = 1,
  kLocQpOpErr = 2,
  kLocEecOpErr = 3,
  kLocProtErr = 4,
  kWrFlushErr = 5,
  kMwBindErr = 6,
  kBadRespErr = 7,
  kLocAccessErr = 8,
  kRemInvReqErr = 9,
  kRemAccessErr = 10,
  kRemOpErr = 11,
  kRetryExcErr = 12,
  kRnrRetryExcErr = 13,
  kLocRddViolErr = 14,
  kRemInvRdReqErr = 15,
  kRemAbortErr = 16,
  kInvEecnErr = 17,
  kInvEecStateErr = 18,
  kFatalErr = 19,
  kRespTimeoutErr = 20,
  kGeneralErr = 21,
  kTmErr = 22,
  kTmRndvIncomplete = 23,
};
const char* wc_status_name(WcStatus s);

// ibv_wc_opcode. Receive opcodes have bit 7 set (kRecv = 128).
enum class WcOpcode : uint8_t {
  kSend = 0,
  kRdmaWrite = 1,
  kRdmaRead = 2,
  kCompSwap = 3,
  kFetchAdd = 4,
  kBindMw = 5,
  kLocalInv = 6,
  kTso = 7,
  kFlush = 8,  // IBV_WC_FLUSH (rdma-core >= 45; 44's headers lack it)
  kAtomicWrite = 9,
  kRecv = 128,
  kRecvRdmaWithImm = 129,
  // Tag matching (TM SRQs): list-operation and receive completions.
  kTmAdd = 130,
  kTmDel = 131,
  kTmSync = 132,
  kTmRecv = 133,
  kTmNoTag = 134,
};

// ibv_wr_opcode.
enum class WrOpcode : uint8_t {
  kRdmaWrite = 0,
  kRdmaWriteWithImm = 1,
  kSend = 2,
  kSendWithImm = 3,
  kRdmaRead = 4,
  kAtomicCmpAndSwp = 5,
  kAtomicFetchAndAdd = 6,
  kLocalInv = 7,
  kBindMw = 8,
  kSendWithInv = 9,
  kTso = 10,
  kDriver1 = 11,
  kFlush = 14,  // IBV_WR_FLUSH (rdma-core >= 45: only through ibv_wr_flush)
  kAtomicWrite = 15,
};
const char* wr_opcode_name(WrOpcode op);

// ibv_access_flags bits.
inline constexpr uint32_t kAccessLocalWrite = 1u << 0;
inline constexpr uint32_t kAccessRemoteWrite = 1u << 1;
inline constexpr uint32_t kAccessRemoteRead = 1u << 2;
inline constexpr uint32_t kAccessRemoteAtomic = 1u << 3;
inline constexpr uint32_t kAccessMwBind = 1u << 4;
inline constexpr uint32_t kAccessZeroBased = 1u << 5;
inline constexpr uint32_t kAccessOnDemand = 1u << 6;
inline constexpr uint32_t kAccessHugetlb = 1u << 7;
// IBV_ACCESS_FLUSH_GLOBAL / _PERSISTENT (IB_UVERBS_ACCESS_FLUSH_*, rdma-core >= 45): the
// rights a FLUSH of that placement type needs on the MR and the QP.
inline constexpr uint32_t kAccessFlushGlobal = 1u << 8;
inline constexpr uint32_t kAccessFlushPersistent = 1u << 9;
// IBV_ACCESS_RELAXED_ORDERING == IB_UVERBS_ACCESS_OPTIONAL_FIRST (1 << 20). Bits 20..29
// are "optional": a device may ignore them (rdma-core masks them with OPTIONAL_RANGE).
inline constexpr uint32_t kAccessRelaxedOrdering = 1u << 20;
inline constexpr uint32_t kAccessOptionalRange = (((1u << 29) << 1) - 1) & ~((1u << 20) - 1);
// FLUSH placement types (FETH PLT bits, enum ibv_placement_type) and selectivity levels
// (FETH SEL, enum ibv_selectivity_level).
inline constexpr uint8_t kFlushGlobal = 1;
inline constexpr uint8_t kFlushPersistent = 2;
inline constexpr uint8_t kFlushRange = 0;
inline constexpr uint8_t kFlushMr = 1;
inline constexpr uint32_t kAccessRemoteAny =
    kAccessRemoteWrite | kAccessRemoteRead | kAccessRemoteAtomic;

// ibv_qp_attr_mask bits.
inline constexpr uint32_t kQpState = 1u << 0;
inline constexpr uint32_t kQpCurState = 1u << 1;
inline constexpr uint32_t kQpEnSqdAsyncNotify = 1u << 2;
inline constexpr uint32_t kQpAccessFlags = 1u << 3;
inline constexpr uint32_t kQpPkeyIndex = 1u << 4;
inline constexpr uint32_t kQpPort = 1u << 5;
inline constexpr uint32_t kQpQkey = 1u << 6;
inline constexpr uint32_t kQpAv = 1u << 7;
inline constexpr uint32_t kQpPathMtu = 1u << 8;
inline constexpr uint32_t kQpTimeout = 1u << 9;
inline constexpr uint32_t kQpRetryCnt = 1u << 10;
inline constexpr uint32_t kQpRnrRetry = 1u << 11;
inline constexpr uint32_t kQpRqPsn = 1u << 12;
inline constexpr uint32_t kQpMaxQpRdAtomic = 1u << 13;
inline constexpr uint32_t kQpAltPath = 1u << 14;
inline constexpr uint32_t kQpMinRnrTimer = 1u << 15;
inline constexpr uint32_t kQpSqPsn = 1u << 16;
inline constexpr uint32_t kQpMaxDestRdAtomic = 1u << 17;
inline constexpr uint32_t kQpPathMigState = 1u << 18;
inline constexpr uint32_t kQpCap = 1u << 19;
inline constexpr uint32_t kQpDestQpn = 1u << 20;
inline constexpr uint32_t kQpRateLimit = 1u << 25;
// Every bit modify_qp knows about; any other bit → EINVAL.
inline constexpr uint32_t kQpAttrMaskAll =
    ((1u << 21) - 1) | kQpRateLimit;

// ibv_send_flags bits.
inline constexpr uint32_t kSendFence = 1u << 0;
inline constexpr uint32_t kSendSignaled = 1u << 1;
inline constexpr uint32_t kSendSolicited = 1u << 2;
inline constexpr uint32_t kSendInline = 1u << 3;
inline constexpr uint32_t kSendIpCsum = 1u << 4;

// ibv_wc_flags bits.
inline constexpr uint32_t kWcGrh = 1u << 0;
inline constexpr uint32_t kWcWithImm = 1u << 1;
inline constexpr uint32_t kWcIpCsumOk = 1u << 2;
inline constexpr uint32_t kWcWithInv = 1u << 3;
// Tag matching completion flags (ibv_wc_flags): counter sync needed, the message matched a
// posted tag (tag/priv valid), the data is in the buffer.
inline constexpr uint32_t kWcTmSyncReq = 1u << 4;
inline constexpr uint32_t kWcTmMatch = 1u << 5;
inline constexpr uint32_t kWcTmDataValid = 1u << 6;

// ibv_rereg_mr_flags bits.
inline constexpr uint32_t kReregChangeTranslation = 1u << 0;
inline constexpr uint32_t kReregChangePd = 1u << 1;
inline constexpr uint32_t kReregChangeAccess = 1u << 2;
inline constexpr uint32_t kReregFlagsSupported = (kReregChangeAccess << 1) - 1;

// ibv_srq_attr_mask bits.
inline constexpr uint32_t kSrqMaxWr = 1u << 0;
inline constexpr uint32_t kSrqLimit = 1u << 1;

// ibv_event_type.
enum class EventType : uint8_t {
  kCqErr = 0,
  kQpFatal = 1,
  kQpReqErr = 2,
  kQpAccessErr = 3,
  kCommEst = 4,
  kSqDrained = 5,
  kPathMig = 6,
  kPathMigErr = 7,
  kDeviceFatal = 8,
  kPortActive = 9,
  kPortErr = 10,
  kLidChange = 11,
  kPkeyChange = 12,
  kSmChange = 13,
  kSrqErr = 14,
  kSrqLimitReached = 15,
  kQpLastWqeReached = 16,
  kClientReregister = 17,
  kGidChange = 18,
  kWqFatal = 19,
};

// ibv_mtu.
enum class Mtu : uint8_t {
  k256 = 1,
  k512 = 2,
  k1024 = 3,
  k2048 = 4,
  k4096 = 5,
};
// 256 << (mtu - 1); 0 for an invalid enum value.
constexpr uint32_t mtu_bytes(Mtu m) {
  auto v = static_cast<uint8_t>(m);
  return (v >= 1 && v <= 5) ? (128u << v) : 0u;
}
constexpr bool mtu_valid(uint8_t v) { return v >= 1 && v <= 5; }

// ibv_mw_type.
enum class MwType : uint8_t { kType1 = 1, kType2 = 2 };

// ibv_port_state.
enum class PortState : uint8_t {
  kNop = 0,
  kDown = 1,
  kInit = 2,
  kArmed = 3,
  kActive = 4,
  kActiveDefer = 5,
};

// ibv_atomic_cap.
enum class AtomicCap : uint8_t { kNone = 0, kHca = 1, kGlob = 2 };

// ibv_gid_type (the rdma-core enum ibv_gid_type; sysfs says "RoCE v2").
enum class GidType : uint8_t { kIb = 0, kRoceV1 = 1, kRoceV2 = 2 };

// ibv_device_cap_flags bits used by softrnic.
inline constexpr uint32_t kDevCapResizeMaxWr = 1u << 0;
inline constexpr uint32_t kDevCapBadPkeyCntr = 1u << 1;
inline constexpr uint32_t kDevCapBadQkeyCntr = 1u << 2;
inline constexpr uint32_t kDevCapAutoPathMig = 1u << 4;
inline constexpr uint32_t kDevCapChangePhyPort = 1u << 5;
inline constexpr uint32_t kDevCapUdAvPortEnforce = 1u << 6;
inline constexpr uint32_t kDevCapCurrQpStateMod = 1u << 7;
inline constexpr uint32_t kDevCapPortActiveEvent = 1u << 10;
inline constexpr uint32_t kDevCapSysImageGuid = 1u << 11;
inline constexpr uint32_t kDevCapRcRnrNakGen = 1u << 12;
inline constexpr uint32_t kDevCapSrqResize = 1u << 13;
inline constexpr uint32_t kDevCapNNotifyCq = 1u << 14;
inline constexpr uint32_t kDevCapMemWindow = 1u << 17;
inline constexpr uint32_t kDevCapXrc = 1u << 20;
inline constexpr uint32_t kDevCapMemMgtExtensions = 1u << 21;
inline constexpr uint32_t kDevCapMemWindowType2B = 1u << 24;

// ibv link layer (IBV_LINK_LAYER_ETHERNET).
inline constexpr uint8_t kLinkLayerEthernet = 2;

}  // namespace rnic::emu

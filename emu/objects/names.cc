// emu/objects/names.cc: printable names for emu's enums (logs, test messages).
#include "emu/objects/mr.h"
#include "emu/objects/qp.h"
#include "emu/objects/status.h"
#include "emu/objects/types.h"
#include "emu/objects/wr_opcode.h"

namespace rnic::emu {

const char* errc_name(Errc e) {
  switch (e) {
    case Errc::kOk: return "OK";
    case Errc::kPerm: return "EPERM";
    case Errc::kNoEnt: return "ENOENT";
    case Errc::kIntr: return "EINTR";
    case Errc::kIo: return "EIO";
    case Errc::kBadF: return "EBADF";
    case Errc::kAgain: return "EAGAIN";
    case Errc::kNoMem: return "ENOMEM";
    case Errc::kAccess: return "EACCES";
    case Errc::kFault: return "EFAULT";
    case Errc::kBusy: return "EBUSY";
    case Errc::kExist: return "EEXIST";
    case Errc::kNoDev: return "ENODEV";
    case Errc::kInval: return "EINVAL";
    case Errc::kMFile: return "EMFILE";
    case Errc::kNoSpc: return "ENOSPC";
    case Errc::kRange: return "ERANGE";
    case Errc::kNoSys: return "ENOSYS";
    case Errc::kOverflow: return "EOVERFLOW";
    case Errc::kOpNotSupp: return "EOPNOTSUPP";
    case Errc::kAddrInUse: return "EADDRINUSE";
    case Errc::kAddrNotAvail: return "EADDRNOTAVAIL";
    case Errc::kTimedOut: return "ETIMEDOUT";
  }
  return "E?";
}

const char* wc_status_name(WcStatus s) {
  static constexpr const char* kNames[] = {
      "SUCCESS",         "LOC_LEN_ERR",     "LOC_QP_OP_ERR",     "LOC_EEC_OP_ERR",
      "LOC_PROT_ERR",    "WR_FLUSH_ERR",    "MW_BIND_ERR",       "BAD_RESP_ERR",
      "LOC_ACCESS_ERR",  "REM_INV_REQ_ERR", "REM_ACCESS_ERR",    "REM_OP_ERR",
      "RETRY_EXC_ERR",   "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR",
      "REM_ABORT_ERR",   "INV_EECN_ERR",    "INV_EEC_STATE_ERR", "FATAL_ERR",
      "RESP_TIMEOUT_ERR", "GENERAL_ERR",    "TM_ERR",            "TM_RNDV_INCOMPLETE"};
  auto i = static_cast<size_t>(s);
  return i < sizeof(kNames) / sizeof(kNames[0]) ? kNames[i] : "WC_STATUS_?";
}

// From the one WR-opcode table (emu/objects/wr_opcode.h).
const char* wr_opcode_name(WrOpcode op) {
  const char* n = wr_opcode_info(op).name;
  return n != nullptr ? n : "WR_OPCODE_?";
}

const char* qp_state_name(QpState s) {
  static constexpr const char* kNames[] = {"RESET", "INIT", "RTR", "RTS",
                                           "SQD",   "SQE",  "ERR", "UNKNOWN"};
  auto i = static_cast<size_t>(s);
  return i < 8 ? kNames[i] : "QPS_?";
}

const char* qp_type_name(QpType t) {
  switch (t) {
    case QpType::kRc: return "RC";
    case QpType::kUc: return "UC";
    case QpType::kUd: return "UD";
    case QpType::kXrcSend: return "XRC_SEND";
    case QpType::kXrcRecv: return "XRC_RECV";
  }
  return "QPT_?";
}

const char* rkey_result_name(RkeyResult r) {
  switch (r) {
    case RkeyResult::kOk: return "OK";
    case RkeyResult::kBadKey: return "BAD_KEY";
    case RkeyResult::kPdMismatch: return "PD_MISMATCH";
    case RkeyResult::kMwWrongQp: return "MW_WRONG_QP";
    case RkeyResult::kMwUnbound: return "MW_UNBOUND";
    case RkeyResult::kAccessDenied: return "ACCESS_DENIED";
    case RkeyResult::kInvalidState: return "INVALID_STATE";
    case RkeyResult::kOutOfRange: return "OUT_OF_RANGE";
    case RkeyResult::kMisaligned: return "MISALIGNED";
  }
  return "RKEY_?";
}

}  // namespace rnic::emu

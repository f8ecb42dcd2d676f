// emu/cm/mad.h: the CM MAD codec. Every field of every CM message is one row of the layout
// tables below (MAD byte offset, width, position of its least significant bit), taken from
// IBA Vol 1 ch. 12.6 (Tables 106-113, 119-120; cm-notes §3.2-3.5): the encoder and the parser
// both go through these rows and nothing else, and tests/cm/mad_test checks the rows (and the
// bytes they produce) against the IBA offsets.
//
// Conventions (IBA 12.6 / cm-notes §3.3): offsets are MAD offsets (the CM data starts at 24),
// fields are big-endian; a field of `bits` bits with its LSB at bit `lsb` lives in the
// big-endian integer of ceil((bits + lsb) / 8) bytes starting at `off`.
// Example: REQ "Remote CM Response Timeout" = {67, 5, 3}: the high five bits of byte 67.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "emu/cm/agent.h"

namespace rnic::cm::mad {

struct Field {
  uint16_t off;
  uint8_t bits;
  uint8_t lsb;
};
struct Bytes {
  uint16_t off;
  uint16_t len;
};

uint64_t get(const uint8_t* m, Field f);
void put(uint8_t* m, Field f, uint64_t v);  // v is masked to f.bits

inline constexpr uint8_t kBaseVersion = 1;
inline constexpr uint8_t kMgmtClassCm = 0x07;
inline constexpr uint8_t kClassVersion = 2;
inline constexpr uint8_t kMethodGet = 0x01;
inline constexpr uint8_t kMethodSet = 0x02;
inline constexpr uint8_t kMethodSend = 0x03;

// AttributeIDs (cm-notes §3.2).
enum Attr : uint16_t {
  kAttrClassPortInfo = 0x0001,
  kAttrReq = 0x0010,
  kAttrMra = 0x0011,
  kAttrRej = 0x0012,
  kAttrRep = 0x0013,
  kAttrRtu = 0x0014,
  kAttrDreq = 0x0015,
  kAttrDrep = 0x0016,
  kAttrSidrReq = 0x0017,
  kAttrSidrRep = 0x0018,
  kAttrLap = 0x0019,
  kAttrApr = 0x001A,
};
const char* attr_name(uint16_t attr);  // "REQ", ..., "unknown"

// ---------------------------------------------------------------- the layouts
namespace hdr {  // MAD common header (IBA 13.4.2)
inline constexpr Field kBaseVersion{0, 8, 0};
inline constexpr Field kMgmtClass{1, 8, 0};
inline constexpr Field kClassVersion{2, 8, 0};
inline constexpr Field kMethod{3, 8, 0};  // R bit (7) + method
inline constexpr Field kStatus{4, 16, 0};
inline constexpr Field kClassSpecific{6, 16, 0};
inline constexpr Field kTransactionId{8, 64, 0};
inline constexpr Field kAttributeId{16, 16, 0};
inline constexpr Field kAttributeModifier{20, 32, 0};
}  // namespace hdr

namespace req {  // ConnectRequest, IBA Table 106
inline constexpr Field kLocalCommId{24, 32, 0};
inline constexpr Field kVendorId{29, 24, 0};
inline constexpr Field kServiceId{32, 64, 0};
inline constexpr Field kLocalCaGuid{40, 64, 0};
inline constexpr Field kLocalQkey{52, 32, 0};
inline constexpr Field kLocalQpn{56, 24, 0};
inline constexpr Field kResponderResources{59, 8, 0};
inline constexpr Field kLocalEecn{60, 24, 0};
inline constexpr Field kInitiatorDepth{63, 8, 0};
inline constexpr Field kRemoteEecn{64, 24, 0};
inline constexpr Field kRemoteCmResponseTimeout{67, 5, 3};
inline constexpr Field kTransportServiceType{67, 2, 1};
inline constexpr Field kEndToEndFlowControl{67, 1, 0};
inline constexpr Field kStartingPsn{68, 24, 0};
inline constexpr Field kLocalCmResponseTimeout{71, 5, 3};
inline constexpr Field kRetryCount{71, 3, 0};
inline constexpr Field kPartitionKey{72, 16, 0};
inline constexpr Field kPathMtu{74, 4, 4};
inline constexpr Field kRdcExists{74, 1, 3};
inline constexpr Field kRnrRetryCount{74, 3, 0};
inline constexpr Field kMaxCmRetries{75, 4, 4};
inline constexpr Field kSrq{75, 1, 3};
inline constexpr Field kExtendedTransportType{75, 3, 0};
inline constexpr Field kPrimaryLocalLid{76, 16, 0};
inline constexpr Field kPrimaryRemoteLid{78, 16, 0};
inline constexpr Bytes kPrimaryLocalGid{80, 16};
inline constexpr Bytes kPrimaryRemoteGid{96, 16};
inline constexpr Field kPrimaryFlowLabel{112, 20, 12};
inline constexpr Field kPrimaryPacketRate{115, 6, 0};
inline constexpr Field kPrimaryTrafficClass{116, 8, 0};
inline constexpr Field kPrimaryHopLimit{117, 8, 0};
inline constexpr Field kPrimarySl{118, 4, 4};
inline constexpr Field kPrimarySubnetLocal{118, 1, 3};
inline constexpr Field kPrimaryLocalAckTimeout{119, 5, 3};
inline constexpr Bytes kAlternatePath{120, 44};  // same layout as the primary; all zero
inline constexpr Field kAlternateLocalLid{120, 16, 0};
inline constexpr Bytes kPrivateData{164, 92};
}  // namespace req

namespace mra {  // MsgRcptAck, IBA Table 107
inline constexpr Field kLocalCommId{24, 32, 0};
inline constexpr Field kRemoteCommId{28, 32, 0};
inline constexpr Field kMessageMraed{32, 2, 6};  // 0 REQ, 1 REP, 2 LAP
inline constexpr Field kServiceTimeout{33, 5, 3};
inline constexpr Bytes kPrivateData{34, 222};
}  // namespace mra

namespace rej {  // ConnectReject, IBA Table 108
inline constexpr Field kLocalCommId{24, 32, 0};
inline constexpr Field kRemoteCommId{28, 32, 0};
inline constexpr Field kMessageRejected{32, 2, 6};  // 0 REQ, 1 REP, 2 other
inline constexpr Field kRejectInfoLength{33, 7, 1};
inline constexpr Field kReason{34, 16, 0};
inline constexpr Bytes kAri{36, 72};
inline constexpr Bytes kPrivateData{108, 148};
}  // namespace rej

namespace rep {  // ConnectReply, IBA Table 110
inline constexpr Field kLocalCommId{24, 32, 0};
inline constexpr Field kRemoteCommId{28, 32, 0};
inline constexpr Field kLocalQkey{32, 32, 0};
inline constexpr Field kLocalQpn{36, 24, 0};
inline constexpr Field kLocalEecn{40, 24, 0};
inline constexpr Field kStartingPsn{44, 24, 0};
inline constexpr Field kResponderResources{48, 8, 0};
inline constexpr Field kInitiatorDepth{49, 8, 0};
inline constexpr Field kTargetAckDelay{50, 5, 3};
inline constexpr Field kFailoverAccepted{50, 2, 1};
inline constexpr Field kEndToEndFlowControl{50, 1, 0};
inline constexpr Field kRnrRetryCount{51, 3, 5};
inline constexpr Field kSrq{51, 1, 4};
inline constexpr Field kLocalCaGuid{52, 64, 0};
inline constexpr Bytes kPrivateData{60, 196};
}  // namespace rep

namespace rtu {  // ReadyToUse, IBA Table 111
inline constexpr Field kLocalCommId{24, 32, 0};
inline constexpr Field kRemoteCommId{28, 32, 0};
inline constexpr Bytes kPrivateData{32, 224};
}  // namespace rtu

namespace dreq {  // DisconnectRequest, IBA Table 112
inline constexpr Field kLocalCommId{24, 32, 0};
inline constexpr Field kRemoteCommId{28, 32, 0};
inline constexpr Field kRemoteQpn{32, 24, 0};  // the RECEIVER's QPN (Remote QPN/EECN)
inline constexpr Bytes kPrivateData{36, 220};
}  // namespace dreq

namespace drep {  // DisconnectReply, IBA Table 113
inline constexpr Field kLocalCommId{24, 32, 0};
inline constexpr Field kRemoteCommId{28, 32, 0};
inline constexpr Bytes kPrivateData{32, 224};
}  // namespace drep

namespace sidr_req {  // ServiceIDResReq, IBA Table 119
inline constexpr Field kRequestId{24, 32, 0};
inline constexpr Field kPartitionKey{28, 16, 0};
inline constexpr Field kServiceId{32, 64, 0};
inline constexpr Bytes kPrivateData{40, 216};
}  // namespace sidr_req

namespace sidr_rep {  // ServiceIDResReqResp, IBA Table 120
inline constexpr Field kRequestId{24, 32, 0};
inline constexpr Field kStatus{28, 8, 0};
inline constexpr Field kAdditionalInfoLength{29, 8, 0};
inline constexpr Field kQpn{32, 24, 0};
inline constexpr Field kServiceId{36, 64, 0};
inline constexpr Field kQkey{44, 32, 0};
inline constexpr Bytes kClassPortInfo{48, 72};
inline constexpr Bytes kPrivateData{120, 136};
}  // namespace sidr_rep

// ---------------------------------------------------------------- messages
using Gid = std::array<uint8_t, 16>;

struct Header {
  uint8_t base_version = kBaseVersion;
  uint8_t mgmt_class = kMgmtClassCm;
  uint8_t class_version = kClassVersion;
  uint8_t method = kMethodSend;
  uint16_t status = 0;
  uint64_t tid = 0;
  uint16_t attr_id = 0;
  uint32_t attr_mod = 0;
};

struct Req {
  uint32_t local_comm_id = 0;
  uint64_t service_id = 0;
  uint64_t local_ca_guid = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;
  uint8_t responder_resources = 0;
  uint32_t local_eecn = 0;
  uint8_t initiator_depth = 0;
  uint32_t remote_eecn = 0;
  uint8_t remote_cm_response_timeout = 0;
  uint8_t transport_service_type = 0;
  bool flow_control = false;
  uint32_t starting_psn = 0;
  uint8_t local_cm_response_timeout = 0;
  uint8_t retry_count = 0;
  uint16_t pkey = 0xFFFF;
  uint8_t path_mtu = 0;
  bool rdc_exists = false;
  uint8_t rnr_retry_count = 0;
  uint8_t max_cm_retries = 0;
  bool srq = false;
  uint8_t extended_transport = 0;
  uint16_t primary_local_lid = 0;
  uint16_t primary_remote_lid = 0;
  Gid primary_local_gid{};
  Gid primary_remote_gid{};
  uint32_t primary_flow_label = 0;
  uint8_t primary_packet_rate = 0;
  uint8_t primary_traffic_class = 0;
  uint8_t primary_hop_limit = 0;
  uint8_t primary_sl = 0;
  bool primary_subnet_local = false;
  uint8_t primary_local_ack_timeout = 0;
  std::array<uint8_t, kReqPrivateBytes> private_data{};
};

struct Mra {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t message_mraed = 0;
  uint8_t service_timeout = 0;
  std::array<uint8_t, kMraPrivateBytes> private_data{};
};

struct Rej {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint8_t message_rejected = 0;
  uint8_t reject_info_length = 0;
  uint16_t reason = 0;
  std::array<uint8_t, kRejAriBytes> ari{};
  std::array<uint8_t, kRejPrivateBytes> private_data{};
};

struct Rep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t local_qkey = 0;
  uint32_t local_qpn = 0;
  uint32_t local_eecn = 0;
  uint32_t starting_psn = 0;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t target_ack_delay = 0;
  uint8_t failover_accepted = 0;
  bool flow_control = false;
  uint8_t rnr_retry_count = 0;
  bool srq = false;
  uint64_t local_ca_guid = 0;
  std::array<uint8_t, kRepPrivateBytes> private_data{};
};

struct Rtu {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  std::array<uint8_t, kRtuPrivateBytes> private_data{};
};

struct Dreq {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  uint32_t remote_qpn = 0;
  std::array<uint8_t, kDreqPrivateBytes> private_data{};
};

struct Drep {
  uint32_t local_comm_id = 0;
  uint32_t remote_comm_id = 0;
  std::array<uint8_t, kDrepPrivateBytes> private_data{};
};

struct SidrReq {
  uint32_t request_id = 0;
  uint16_t pkey = 0xFFFF;
  uint64_t service_id = 0;
  std::array<uint8_t, kSidrReqPrivateBytes> private_data{};
};

struct SidrRep {
  uint32_t request_id = 0;
  uint8_t status = 0;
  uint8_t additional_info_length = 0;
  uint32_t qpn = 0;
  uint64_t service_id = 0;
  uint32_t qkey = 0;
  std::array<uint8_t, kSidrRepInfoBytes> info{};
  std::array<uint8_t, kSidrRepPrivateBytes> private_data{};
};

using Buf = std::array<uint8_t, kMadBytes>;

// Encoders: the whole 256-byte MAD (header with method Send, the given TID, attribute and
// modifier 0; every byte the message does not define is zero).
Buf encode(const Req& m, uint64_t tid);
Buf encode(const Mra& m, uint64_t tid);
Buf encode(const Rej& m, uint64_t tid);
Buf encode(const Rep& m, uint64_t tid);
Buf encode(const Rtu& m, uint64_t tid);
Buf encode(const Dreq& m, uint64_t tid);
Buf encode(const Drep& m, uint64_t tid);
Buf encode(const SidrReq& m, uint64_t tid);
Buf encode(const SidrRep& m, uint64_t tid);

// Parser verdicts. Only kOk goes on to a decode_*().
enum class Verdict : uint8_t {
  kOk,
  kBadSize,          // not exactly 256 bytes
  kBadBaseVersion,   // BaseVersion != 1
  kBadClass,         // MgmtClass != 0x07
  kBadClassVersion,  // ClassVersion != 2
  kUnsupported,      // a method other than Send (Get/Set/responses), LAP, APR, ClassPortInfo
  kBadAttribute,     // AttributeID that names no CM message
  kBadField,         // a field with a reserved/impossible value (decode_*)
};
const char* verdict_name(Verdict v);

// Header checks; fills *h when the header parsed (also for kUnsupported / kBadAttribute).
Verdict parse_header(std::span<const uint8_t> mad, Header* h);

// Decoders (REQUIRES: parse_header said kOk for this attribute). kBadField for values no
// sender may put there: REQ transport type 2 or path MTU 0/6+, MRA/REJ message code 3, REJ
// info length > 72, SIDR_REP info length > 72.
Verdict decode(const uint8_t* mad, Req* m);
Verdict decode(const uint8_t* mad, Mra* m);
Verdict decode(const uint8_t* mad, Rej* m);
Verdict decode(const uint8_t* mad, Rep* m);
Verdict decode(const uint8_t* mad, Rtu* m);
Verdict decode(const uint8_t* mad, Dreq* m);
Verdict decode(const uint8_t* mad, Drep* m);
Verdict decode(const uint8_t* mad, SidrReq* m);
Verdict decode(const uint8_t* mad, SidrRep* m);

}  // namespace rnic::cm::mad

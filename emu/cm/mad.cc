// emu/cm/mad.cc: encode/decode of CM MADs through the layout rows of mad.h.
#include "emu/cm/mad.h"

#include <cstring>

namespace rnic::cm::mad {

namespace {

constexpr unsigned width_bytes(Field f) { return (f.bits + f.lsb + 7u) / 8u; }
constexpr uint64_t mask_of(unsigned bits) {
  return bits >= 64 ? ~uint64_t{0} : ((uint64_t{1} << bits) - 1);
}

template <size_t N>
void put_bytes(uint8_t* m, Bytes b, const std::array<uint8_t, N>& src) {
  static_assert(N > 0);
  std::memcpy(m + b.off, src.data(), b.len < N ? b.len : N);
}
template <size_t N>
void get_bytes(const uint8_t* m, Bytes b, std::array<uint8_t, N>* dst) {
  dst->fill(0);
  std::memcpy(dst->data(), m + b.off, b.len < N ? b.len : N);
}

Buf start(uint16_t attr, uint64_t tid) {
  Buf b{};
  put(b.data(), hdr::kBaseVersion, kBaseVersion);
  put(b.data(), hdr::kMgmtClass, kMgmtClassCm);
  put(b.data(), hdr::kClassVersion, kClassVersion);
  put(b.data(), hdr::kMethod, kMethodSend);
  put(b.data(), hdr::kTransactionId, tid);
  put(b.data(), hdr::kAttributeId, attr);
  return b;
}

}  // namespace

uint64_t get(const uint8_t* m, Field f) {
  uint64_t v = 0;
  const unsigned n = width_bytes(f);
  if (n > 8) {  // 64-bit field with lsb 0 only
    for (unsigned i = 0; i < 8; ++i) v = (v << 8) | m[f.off + i];
    return v;
  }
  for (unsigned i = 0; i < n; ++i) v = (v << 8) | m[f.off + i];
  return (v >> f.lsb) & mask_of(f.bits);
}

void put(uint8_t* m, Field f, uint64_t v) {
  const unsigned n = width_bytes(f);
  if (n >= 8) {
    for (unsigned i = 0; i < 8; ++i) m[f.off + i] = static_cast<uint8_t>(v >> (56 - 8 * i));
    return;
  }
  uint64_t cur = 0;
  for (unsigned i = 0; i < n; ++i) cur = (cur << 8) | m[f.off + i];
  const uint64_t mk = mask_of(f.bits) << f.lsb;
  cur = (cur & ~mk) | ((v << f.lsb) & mk);
  for (unsigned i = 0; i < n; ++i)
    m[f.off + i] = static_cast<uint8_t>(cur >> (8 * (n - 1 - i)));
}

const char* attr_name(uint16_t attr) {
  switch (attr) {
    case kAttrClassPortInfo: return "ClassPortInfo";
    case kAttrReq: return "REQ";
    case kAttrMra: return "MRA";
    case kAttrRej: return "REJ";
    case kAttrRep: return "REP";
    case kAttrRtu: return "RTU";
    case kAttrDreq: return "DREQ";
    case kAttrDrep: return "DREP";
    case kAttrSidrReq: return "SIDR_REQ";
    case kAttrSidrRep: return "SIDR_REP";
    case kAttrLap: return "LAP";
    case kAttrApr: return "APR";
    default: return "unknown";
  }
}

const char* verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kOk: return "ok";
    case Verdict::kBadSize: return "bad size";
    case Verdict::kBadBaseVersion: return "bad base version";
    case Verdict::kBadClass: return "not the CM class";
    case Verdict::kBadClassVersion: return "bad class version";
    case Verdict::kUnsupported: return "unsupported method or attribute";
    case Verdict::kBadAttribute: return "unknown attribute";
    case Verdict::kBadField: return "bad field value";
  }
  return "?";
}

// ---------------------------------------------------------------- encode

Buf encode(const Req& r, uint64_t tid) {
  Buf b = start(kAttrReq, tid);
  uint8_t* m = b.data();
  using namespace req;
  put(m, kLocalCommId, r.local_comm_id);
  put(m, kServiceId, r.service_id);
  put(m, kLocalCaGuid, r.local_ca_guid);
  put(m, kLocalQkey, r.local_qkey);
  put(m, kLocalQpn, r.local_qpn);
  put(m, kResponderResources, r.responder_resources);
  put(m, kLocalEecn, r.local_eecn);
  put(m, kInitiatorDepth, r.initiator_depth);
  put(m, kRemoteEecn, r.remote_eecn);
  put(m, kRemoteCmResponseTimeout, r.remote_cm_response_timeout);
  put(m, kTransportServiceType, r.transport_service_type);
  put(m, kEndToEndFlowControl, r.flow_control ? 1 : 0);
  put(m, kStartingPsn, r.starting_psn);
  put(m, kLocalCmResponseTimeout, r.local_cm_response_timeout);
  put(m, kRetryCount, r.retry_count);
  put(m, kPartitionKey, r.pkey);
  put(m, kPathMtu, r.path_mtu);
  put(m, kRdcExists, r.rdc_exists ? 1 : 0);
  put(m, kRnrRetryCount, r.rnr_retry_count);
  put(m, kMaxCmRetries, r.max_cm_retries);
  put(m, kSrq, r.srq ? 1 : 0);
  put(m, kExtendedTransportType, r.extended_transport);
  put(m, kPrimaryLocalLid, r.primary_local_lid);
  put(m, kPrimaryRemoteLid, r.primary_remote_lid);
  put_bytes(m, kPrimaryLocalGid, r.primary_local_gid);
  put_bytes(m, kPrimaryRemoteGid, r.primary_remote_gid);
  put(m, kPrimaryFlowLabel, r.primary_flow_label);
  put(m, kPrimaryPacketRate, r.primary_packet_rate);
  put(m, kPrimaryTrafficClass, r.primary_traffic_class);
  put(m, kPrimaryHopLimit, r.primary_hop_limit);
  put(m, kPrimarySl, r.primary_sl);
  put(m, kPrimarySubnetLocal, r.primary_subnet_local ? 1 : 0);
  put(m, kPrimaryLocalAckTimeout, r.primary_local_ack_timeout);
  put_bytes(m, kPrivateData, r.private_data);
  return b;
}

Buf encode(const Mra& r, uint64_t tid) {
  Buf b = start(kAttrMra, tid);
  uint8_t* m = b.data();
  using namespace mra;
  put(m, kLocalCommId, r.local_comm_id);
  put(m, kRemoteCommId, r.remote_comm_id);
  put(m, kMessageMraed, r.message_mraed);
  put(m, kServiceTimeout, r.service_timeout);
  put_bytes(m, kPrivateData, r.private_data);
  return b;
}

Buf encode(const Rej& r, uint64_t tid) {
  Buf b = start(kAttrRej, tid);
  uint8_t* m = b.data();
  using namespace rej;
  put(m, kLocalCommId, r.local_comm_id);
  put(m, kRemoteCommId, r.remote_comm_id);
  put(m, kMessageRejected, r.message_rejected);
  put(m, kRejectInfoLength, r.reject_info_length);
  put(m, kReason, r.reason);
  put_bytes(m, kAri, r.ari);
  put_bytes(m, kPrivateData, r.private_data);
  return b;
}

Buf encode(const Rep& r, uint64_t tid) {
  Buf b = start(kAttrRep, tid);
  uint8_t* m = b.data();
  using namespace rep;
  put(m, kLocalCommId, r.local_comm_id);
  put(m, kRemoteCommId, r.remote_comm_id);
  put(m, kLocalQkey, r.local_qkey);
  put(m, kLocalQpn, r.local_qpn);
  put(m, kLocalEecn, r.local_eecn);
  put(m, kStartingPsn, r.starting_psn);
  put(m, kResponderResources, r.responder_resources);
  put(m, kInitiatorDepth, r.initiator_depth);
  put(m, kTargetAckDelay, r.target_ack_delay);
  put(m, kFailoverAccepted, r.failover_accepted);
  put(m, kEndToEndFlowControl, r.flow_control ? 1 : 0);
  put(m, kRnrRetryCount, r.rnr_retry_count);
  put(m, kSrq, r.srq ? 1 : 0);
  put(m, kLocalCaGuid, r.local_ca_guid);
  put_bytes(m, kPrivateData, r.private_data);
  return b;
}

Buf encode(const Rtu& r, uint64_t tid) {
  Buf b = start(kAttrRtu, tid);
  put(b.data(), rtu::kLocalCommId, r.local_comm_id);
  put(b.data(), rtu::kRemoteCommId, r.remote_comm_id);
  put_bytes(b.data(), rtu::kPrivateData, r.private_data);
  return b;
}

Buf encode(const Dreq& r, uint64_t tid) {
  Buf b = start(kAttrDreq, tid);
  put(b.data(), dreq::kLocalCommId, r.local_comm_id);
  put(b.data(), dreq::kRemoteCommId, r.remote_comm_id);
  put(b.data(), dreq::kRemoteQpn, r.remote_qpn);
  put_bytes(b.data(), dreq::kPrivateData, r.private_data);
  return b;
}

Buf encode(const Drep& r, uint64_t tid) {
  Buf b = start(kAttrDrep, tid);
  put(b.data(), drep::kLocalCommId, r.local_comm_id);
  put(b.data(), drep::kRemoteCommId, r.remote_comm_id);
  put_bytes(b.data(), drep::kPrivateData, r.private_data);
  return b;
}

Buf encode(const SidrReq& r, uint64_t tid) {
  Buf b = start(kAttrSidrReq, tid);
  put(b.data(), sidr_req::kRequestId, r.request_id);
  put(b.data(), sidr_req::kPartitionKey, r.pkey);
  put(b.data(), sidr_req::kServiceId, r.service_id);
  put_bytes(b.data(), sidr_req::kPrivateData, r.private_data);
  return b;
}

Buf encode(const SidrRep& r, uint64_t tid) {
  Buf b = start(kAttrSidrRep, tid);
  uint8_t* m = b.data();
  using namespace sidr_rep;
  put(m, kRequestId, r.request_id);
  put(m, kStatus, r.status);
  put(m, kAdditionalInfoLength, r.additional_info_length);
  put(m, kQpn, r.qpn);
  put(m, kServiceId, r.service_id);
  put(m, kQkey, r.qkey);
  put_bytes(m, kClassPortInfo, r.info);
  put_bytes(m, kPrivateData, r.private_data);
  return b;
}

// ---------------------------------------------------------------- parse / decode

Verdict parse_header(std::span<const uint8_t> mad, Header* h) {
  if (mad.size() != kMadBytes) return Verdict::kBadSize;
  const uint8_t* m = mad.data();
  Header x;
  x.base_version = static_cast<uint8_t>(get(m, hdr::kBaseVersion));
  x.mgmt_class = static_cast<uint8_t>(get(m, hdr::kMgmtClass));
  x.class_version = static_cast<uint8_t>(get(m, hdr::kClassVersion));
  x.method = static_cast<uint8_t>(get(m, hdr::kMethod));
  x.status = static_cast<uint16_t>(get(m, hdr::kStatus));
  x.tid = get(m, hdr::kTransactionId);
  x.attr_id = static_cast<uint16_t>(get(m, hdr::kAttributeId));
  x.attr_mod = static_cast<uint32_t>(get(m, hdr::kAttributeModifier));
  if (x.base_version != kBaseVersion) return Verdict::kBadBaseVersion;
  if (x.mgmt_class != kMgmtClassCm) return Verdict::kBadClass;
  if (x.class_version != kClassVersion) return Verdict::kBadClassVersion;
  *h = x;
  if (x.method != kMethodSend) return Verdict::kUnsupported;
  switch (x.attr_id) {
    case kAttrReq: case kAttrMra: case kAttrRej: case kAttrRep: case kAttrRtu:
    case kAttrDreq: case kAttrDrep: case kAttrSidrReq: case kAttrSidrRep:
      return Verdict::kOk;
    case kAttrClassPortInfo: case kAttrLap: case kAttrApr:
      return Verdict::kUnsupported;
    default:
      return Verdict::kBadAttribute;
  }
}

Verdict decode(const uint8_t* m, Req* r) {
  using namespace req;
  Req x;
  x.local_comm_id = static_cast<uint32_t>(get(m, kLocalCommId));
  x.service_id = get(m, kServiceId);
  x.local_ca_guid = get(m, kLocalCaGuid);
  x.local_qkey = static_cast<uint32_t>(get(m, kLocalQkey));
  x.local_qpn = static_cast<uint32_t>(get(m, kLocalQpn));
  x.responder_resources = static_cast<uint8_t>(get(m, kResponderResources));
  x.local_eecn = static_cast<uint32_t>(get(m, kLocalEecn));
  x.initiator_depth = static_cast<uint8_t>(get(m, kInitiatorDepth));
  x.remote_eecn = static_cast<uint32_t>(get(m, kRemoteEecn));
  x.remote_cm_response_timeout = static_cast<uint8_t>(get(m, kRemoteCmResponseTimeout));
  x.transport_service_type = static_cast<uint8_t>(get(m, kTransportServiceType));
  x.flow_control = get(m, kEndToEndFlowControl) != 0;
  x.starting_psn = static_cast<uint32_t>(get(m, kStartingPsn));
  x.local_cm_response_timeout = static_cast<uint8_t>(get(m, kLocalCmResponseTimeout));
  x.retry_count = static_cast<uint8_t>(get(m, kRetryCount));
  x.pkey = static_cast<uint16_t>(get(m, kPartitionKey));
  x.path_mtu = static_cast<uint8_t>(get(m, kPathMtu));
  x.rdc_exists = get(m, kRdcExists) != 0;
  x.rnr_retry_count = static_cast<uint8_t>(get(m, kRnrRetryCount));
  x.max_cm_retries = static_cast<uint8_t>(get(m, kMaxCmRetries));
  x.srq = get(m, kSrq) != 0;
  x.extended_transport = static_cast<uint8_t>(get(m, kExtendedTransportType));
  x.primary_local_lid = static_cast<uint16_t>(get(m, kPrimaryLocalLid));
  x.primary_remote_lid = static_cast<uint16_t>(get(m, kPrimaryRemoteLid));
  get_bytes(m, kPrimaryLocalGid, &x.primary_local_gid);
  get_bytes(m, kPrimaryRemoteGid, &x.primary_remote_gid);
  x.primary_flow_label = static_cast<uint32_t>(get(m, kPrimaryFlowLabel));
  x.primary_packet_rate = static_cast<uint8_t>(get(m, kPrimaryPacketRate));
  x.primary_traffic_class = static_cast<uint8_t>(get(m, kPrimaryTrafficClass));
  x.primary_hop_limit = static_cast<uint8_t>(get(m, kPrimaryHopLimit));
  x.primary_sl = static_cast<uint8_t>(get(m, kPrimarySl));
  x.primary_subnet_local = get(m, kPrimarySubnetLocal) != 0;
  x.primary_local_ack_timeout = static_cast<uint8_t>(get(m, kPrimaryLocalAckTimeout));
  get_bytes(m, kPrivateData, &x.private_data);
  if (x.transport_service_type == 2) return Verdict::kBadField;
  if (x.path_mtu < 1 || x.path_mtu > 5) return Verdict::kBadField;
  *r = x;
  return Verdict::kOk;
}

Verdict decode(const uint8_t* m, Mra* r) {
  using namespace mra;
  Mra x;
  x.local_comm_id = static_cast<uint32_t>(get(m, kLocalCommId));
  x.remote_comm_id = static_cast<uint32_t>(get(m, kRemoteCommId));
  x.message_mraed = static_cast<uint8_t>(get(m, kMessageMraed));
  x.service_timeout = static_cast<uint8_t>(get(m, kServiceTimeout));
  get_bytes(m, kPrivateData, &x.private_data);
  if (x.message_mraed == 3) return Verdict::kBadField;
  *r = x;
  return Verdict::kOk;
}

Verdict decode(const uint8_t* m, Rej* r) {
  using namespace rej;
  Rej x;
  x.local_comm_id = static_cast<uint32_t>(get(m, kLocalCommId));
  x.remote_comm_id = static_cast<uint32_t>(get(m, kRemoteCommId));
  x.message_rejected = static_cast<uint8_t>(get(m, kMessageRejected));
  x.reject_info_length = static_cast<uint8_t>(get(m, kRejectInfoLength));
  x.reason = static_cast<uint16_t>(get(m, kReason));
  get_bytes(m, kAri, &x.ari);
  get_bytes(m, kPrivateData, &x.private_data);
  if (x.message_rejected == 3 || x.reject_info_length > kRejAriBytes) return Verdict::kBadField;
  *r = x;
  return Verdict::kOk;
}

Verdict decode(const uint8_t* m, Rep* r) {
  using namespace rep;
  Rep x;
  x.local_comm_id = static_cast<uint32_t>(get(m, kLocalCommId));
  x.remote_comm_id = static_cast<uint32_t>(get(m, kRemoteCommId));
  x.local_qkey = static_cast<uint32_t>(get(m, kLocalQkey));
  x.local_qpn = static_cast<uint32_t>(get(m, kLocalQpn));
  x.local_eecn = static_cast<uint32_t>(get(m, kLocalEecn));
  x.starting_psn = static_cast<uint32_t>(get(m, kStartingPsn));
  x.responder_resources = static_cast<uint8_t>(get(m, kResponderResources));
  x.initiator_depth = static_cast<uint8_t>(get(m, kInitiatorDepth));
  x.target_ack_delay = static_cast<uint8_t>(get(m, kTargetAckDelay));
  x.failover_accepted = static_cast<uint8_t>(get(m, kFailoverAccepted));
  x.flow_control = get(m, kEndToEndFlowControl) != 0;
  x.rnr_retry_count = static_cast<uint8_t>(get(m, kRnrRetryCount));
  x.srq = get(m, kSrq) != 0;
  x.local_ca_guid = get(m, kLocalCaGuid);
  get_bytes(m, kPrivateData, &x.private_data);
  *r = x;
  return Verdict::kOk;
}

Verdict decode(const uint8_t* m, Rtu* r) {
  r->local_comm_id = static_cast<uint32_t>(get(m, rtu::kLocalCommId));
  r->remote_comm_id = static_cast<uint32_t>(get(m, rtu::kRemoteCommId));
  get_bytes(m, rtu::kPrivateData, &r->private_data);
  return Verdict::kOk;
}

Verdict decode(const uint8_t* m, Dreq* r) {
  r->local_comm_id = static_cast<uint32_t>(get(m, dreq::kLocalCommId));
  r->remote_comm_id = static_cast<uint32_t>(get(m, dreq::kRemoteCommId));
  r->remote_qpn = static_cast<uint32_t>(get(m, dreq::kRemoteQpn));
  get_bytes(m, dreq::kPrivateData, &r->private_data);
  return Verdict::kOk;
}

Verdict decode(const uint8_t* m, Drep* r) {
  r->local_comm_id = static_cast<uint32_t>(get(m, drep::kLocalCommId));
  r->remote_comm_id = static_cast<uint32_t>(get(m, drep::kRemoteCommId));
  get_bytes(m, drep::kPrivateData, &r->private_data);
  return Verdict::kOk;
}

Verdict decode(const uint8_t* m, SidrReq* r) {
  r->request_id = static_cast<uint32_t>(get(m, sidr_req::kRequestId));
  r->pkey = static_cast<uint16_t>(get(m, sidr_req::kPartitionKey));
  r->service_id = get(m, sidr_req::kServiceId);
  get_bytes(m, sidr_req::kPrivateData, &r->private_data);
  return Verdict::kOk;
}

Verdict decode(const uint8_t* m, SidrRep* r) {
  using namespace sidr_rep;
  SidrRep x;
  x.request_id = static_cast<uint32_t>(get(m, kRequestId));
  x.status = static_cast<uint8_t>(get(m, kStatus));
  x.additional_info_length = static_cast<uint8_t>(get(m, kAdditionalInfoLength));
  x.qpn = static_cast<uint32_t>(get(m, kQpn));
  x.service_id = get(m, kServiceId);
  x.qkey = static_cast<uint32_t>(get(m, kQkey));
  get_bytes(m, kClassPortInfo, &x.info);
  get_bytes(m, kPrivateData, &x.private_data);
  if (x.additional_info_length > kSidrRepInfoBytes) return Verdict::kBadField;
  *r = x;
  return Verdict::kOk;
}

}  // namespace rnic::cm::mad

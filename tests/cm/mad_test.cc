// tests/cm/mad_test: the CM MAD layouts against the IBA (Vol 1 Tables 106-113, 119-120;
// cm-notes §3.2-3.5). Two independent checks: (1) every layout row equals the IBA offset /
// width / bit position written out here by hand, (2) encoding a message with distinct values
// puts exactly those bytes at the IBA offsets (expected bytes are spelled out, not computed
// through the table), so a moved or resized field fails either way. Plus round trips and
// the parser's refusals.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "emu/cm/mad.h"

namespace rnic::cm::mad {
namespace {

struct Row {
  const char* name;
  Field f;
  uint16_t off;
  uint8_t bits;
  uint8_t lsb;
};

void check_rows(std::initializer_list<Row> rows) {
  for (const Row& r : rows) {
    EXPECT_EQ(r.f.off, r.off) << r.name;
    EXPECT_EQ(r.f.bits, r.bits) << r.name;
    EXPECT_EQ(r.f.lsb, r.lsb) << r.name;
  }
}

TEST(MadLayout, HeaderRows) {
  check_rows({{"BaseVersion", hdr::kBaseVersion, 0, 8, 0},
              {"MgmtClass", hdr::kMgmtClass, 1, 8, 0},
              {"ClassVersion", hdr::kClassVersion, 2, 8, 0},
              {"Method", hdr::kMethod, 3, 8, 0},
              {"Status", hdr::kStatus, 4, 16, 0},
              {"TID", hdr::kTransactionId, 8, 64, 0},
              {"AttributeID", hdr::kAttributeId, 16, 16, 0},
              {"AttributeModifier", hdr::kAttributeModifier, 20, 32, 0}});
}

TEST(MadLayout, ReqRowsAreTable106) {
  using namespace req;
  check_rows({{"LocalCommID", kLocalCommId, 24, 32, 0},
              {"ServiceID", kServiceId, 32, 64, 0},
              {"LocalCAGUID", kLocalCaGuid, 40, 64, 0},
              {"LocalQKey", kLocalQkey, 52, 32, 0},
              {"LocalQPN", kLocalQpn, 56, 24, 0},
              {"ResponderResources", kResponderResources, 59, 8, 0},
              {"LocalEECN", kLocalEecn, 60, 24, 0},
              {"InitiatorDepth", kInitiatorDepth, 63, 8, 0},
              {"RemoteEECN", kRemoteEecn, 64, 24, 0},
              {"RemoteCMRespTimeout", kRemoteCmResponseTimeout, 67, 5, 3},
              {"TransportServiceType", kTransportServiceType, 67, 2, 1},
              {"E2EFlowControl", kEndToEndFlowControl, 67, 1, 0},
              {"StartingPSN", kStartingPsn, 68, 24, 0},
              {"LocalCMRespTimeout", kLocalCmResponseTimeout, 71, 5, 3},
              {"RetryCount", kRetryCount, 71, 3, 0},
              {"PKey", kPartitionKey, 72, 16, 0},
              {"PathMTU", kPathMtu, 74, 4, 4},
              {"RDCExists", kRdcExists, 74, 1, 3},
              {"RNRRetryCount", kRnrRetryCount, 74, 3, 0},
              {"MaxCMRetries", kMaxCmRetries, 75, 4, 4},
              {"SRQ", kSrq, 75, 1, 3},
              {"ExtTransport", kExtendedTransportType, 75, 3, 0},
              {"PrimaryLocalLID", kPrimaryLocalLid, 76, 16, 0},
              {"PrimaryRemoteLID", kPrimaryRemoteLid, 78, 16, 0},
              {"PrimaryFlowLabel", kPrimaryFlowLabel, 112, 20, 12},
              {"PrimaryPacketRate", kPrimaryPacketRate, 115, 6, 0},
              {"PrimaryTrafficClass", kPrimaryTrafficClass, 116, 8, 0},
              {"PrimaryHopLimit", kPrimaryHopLimit, 117, 8, 0},
              {"PrimarySL", kPrimarySl, 118, 4, 4},
              {"PrimarySubnetLocal", kPrimarySubnetLocal, 118, 1, 3},
              {"PrimaryLocalACKTimeout", kPrimaryLocalAckTimeout, 119, 5, 3}});
  EXPECT_EQ(kPrimaryLocalGid.off, 80);
  EXPECT_EQ(kPrimaryRemoteGid.off, 96);
  EXPECT_EQ(kPrivateData.off, 164);
  EXPECT_EQ(kPrivateData.len, 92);
}

TEST(MadLayout, OtherMessageRows) {
  check_rows({{"REP.LocalCommID", rep::kLocalCommId, 24, 32, 0},
              {"REP.RemoteCommID", rep::kRemoteCommId, 28, 32, 0},
              {"REP.LocalQKey", rep::kLocalQkey, 32, 32, 0},
              {"REP.LocalQPN", rep::kLocalQpn, 36, 24, 0},
              {"REP.LocalEECN", rep::kLocalEecn, 40, 24, 0},
              {"REP.StartingPSN", rep::kStartingPsn, 44, 24, 0},
              {"REP.ResponderResources", rep::kResponderResources, 48, 8, 0},
              {"REP.InitiatorDepth", rep::kInitiatorDepth, 49, 8, 0},
              {"REP.TargetACKDelay", rep::kTargetAckDelay, 50, 5, 3},
              {"REP.FailoverAccepted", rep::kFailoverAccepted, 50, 2, 1},
              {"REP.E2EFlowControl", rep::kEndToEndFlowControl, 50, 1, 0},
              {"REP.RNRRetryCount", rep::kRnrRetryCount, 51, 3, 5},
              {"REP.SRQ", rep::kSrq, 51, 1, 4},
              {"REP.LocalCAGUID", rep::kLocalCaGuid, 52, 64, 0},
              {"RTU.LocalCommID", rtu::kLocalCommId, 24, 32, 0},
              {"RTU.RemoteCommID", rtu::kRemoteCommId, 28, 32, 0},
              {"REJ.LocalCommID", rej::kLocalCommId, 24, 32, 0},
              {"REJ.RemoteCommID", rej::kRemoteCommId, 28, 32, 0},
              {"REJ.MsgREJed", rej::kMessageRejected, 32, 2, 6},
              {"REJ.RejectInfoLength", rej::kRejectInfoLength, 33, 7, 1},
              {"REJ.Reason", rej::kReason, 34, 16, 0},
              {"MRA.LocalCommID", mra::kLocalCommId, 24, 32, 0},
              {"MRA.RemoteCommID", mra::kRemoteCommId, 28, 32, 0},
              {"MRA.MsgMRAed", mra::kMessageMraed, 32, 2, 6},
              {"MRA.ServiceTimeout", mra::kServiceTimeout, 33, 5, 3},
              {"DREQ.LocalCommID", dreq::kLocalCommId, 24, 32, 0},
              {"DREQ.RemoteCommID", dreq::kRemoteCommId, 28, 32, 0},
              {"DREQ.RemoteQPN", dreq::kRemoteQpn, 32, 24, 0},
              {"DREP.LocalCommID", drep::kLocalCommId, 24, 32, 0},
              {"DREP.RemoteCommID", drep::kRemoteCommId, 28, 32, 0},
              {"SIDR_REQ.RequestID", sidr_req::kRequestId, 24, 32, 0},
              {"SIDR_REQ.PKey", sidr_req::kPartitionKey, 28, 16, 0},
              {"SIDR_REQ.ServiceID", sidr_req::kServiceId, 32, 64, 0},
              {"SIDR_REP.RequestID", sidr_rep::kRequestId, 24, 32, 0},
              {"SIDR_REP.Status", sidr_rep::kStatus, 28, 8, 0},
              {"SIDR_REP.AddInfoLen", sidr_rep::kAdditionalInfoLength, 29, 8, 0},
              {"SIDR_REP.QPN", sidr_rep::kQpn, 32, 24, 0},
              {"SIDR_REP.ServiceID", sidr_rep::kServiceId, 36, 64, 0},
              {"SIDR_REP.QKey", sidr_rep::kQkey, 44, 32, 0}});
  EXPECT_EQ(rep::kPrivateData.off, 60);
  EXPECT_EQ(rtu::kPrivateData.off, 32);
  EXPECT_EQ(rej::kAri.off, 36);
  EXPECT_EQ(rej::kPrivateData.off, 108);
  EXPECT_EQ(mra::kPrivateData.off, 34);
  EXPECT_EQ(dreq::kPrivateData.off, 36);
  EXPECT_EQ(drep::kPrivateData.off, 32);
  EXPECT_EQ(sidr_req::kPrivateData.off, 40);
  EXPECT_EQ(sidr_rep::kClassPortInfo.off, 48);
  EXPECT_EQ(sidr_rep::kPrivateData.off, 120);
  // Every private-data area runs to the end of the 256-byte MAD.
  for (Bytes b : {req::kPrivateData, rep::kPrivateData, rtu::kPrivateData, rej::kPrivateData,
                  mra::kPrivateData, dreq::kPrivateData, drep::kPrivateData,
                  sidr_req::kPrivateData, sidr_rep::kPrivateData})
    EXPECT_EQ(b.off + b.len, 256);
}

// Big-endian bytes of v (n bytes) at m+off.
void expect_be(const Buf& m, size_t off, uint64_t v, size_t n, const char* what) {
  for (size_t i = 0; i < n; ++i)
    EXPECT_EQ(m[off + i], static_cast<uint8_t>(v >> (8 * (n - 1 - i))))
        << what << " byte " << i << " at MAD offset " << off + i;
}

void expect_header(const Buf& m, uint16_t attr, uint64_t tid) {
  EXPECT_EQ(m[0], 1);     // BaseVersion
  EXPECT_EQ(m[1], 0x07);  // CM class
  EXPECT_EQ(m[2], 2);     // class version
  EXPECT_EQ(m[3], 0x03);  // Send
  expect_be(m, 4, 0, 4, "status+class specific");
  expect_be(m, 8, tid, 8, "TID");
  expect_be(m, 16, attr, 2, "AttributeID");
  expect_be(m, 18, 0, 6, "reserved+modifier");
}

TEST(MadEncode, ReqBytesAtIbaOffsets) {
  Req r;
  r.local_comm_id = 0x11223344;
  r.service_id = 0x0000000001061D2Full;
  r.local_ca_guid = 0x0211223344556677ull;
  r.local_qpn = 0xABCDEF;
  r.responder_resources = 0x5A;
  r.initiator_depth = 0xA5;
  r.remote_cm_response_timeout = 20;  // 10100
  r.transport_service_type = 1;       // UC
  r.flow_control = true;
  r.starting_psn = 0x123456;
  r.local_cm_response_timeout = 19;  // 10011
  r.retry_count = 6;
  r.pkey = 0xFFFF;
  r.path_mtu = 5;
  r.rnr_retry_count = 7;
  r.max_cm_retries = 15;
  r.srq = true;
  r.primary_local_lid = 0xFFFF;
  r.primary_remote_lid = 0xFFFE;
  for (int i = 0; i < 16; ++i) {
    r.primary_local_gid[i] = static_cast<uint8_t>(0x10 + i);
    r.primary_remote_gid[i] = static_cast<uint8_t>(0x30 + i);
  }
  r.primary_flow_label = 0xABCDE;
  r.primary_packet_rate = 0x2A;
  r.primary_traffic_class = 0x68;
  r.primary_hop_limit = 64;
  r.primary_sl = 9;
  r.primary_subnet_local = false;
  r.primary_local_ack_timeout = 19;
  for (size_t i = 0; i < r.private_data.size(); ++i) r.private_data[i] = static_cast<uint8_t>(i + 1);
  const Buf m = encode(r, 0x0102030405060708ull);
  expect_header(m, 0x0010, 0x0102030405060708ull);
  expect_be(m, 24, 0x11223344, 4, "LocalCommID");
  expect_be(m, 28, 0, 4, "reserved/VendorID");
  expect_be(m, 32, 0x0000000001061D2Full, 8, "ServiceID");
  expect_be(m, 40, 0x0211223344556677ull, 8, "LocalCAGUID");
  expect_be(m, 48, 0, 4, "reserved");
  expect_be(m, 52, 0, 4, "LocalQKey");
  expect_be(m, 56, 0xABCDEF5A, 4, "LocalQPN|RR");
  expect_be(m, 60, 0x000000A5, 4, "LocalEECN|ID");
  // 64: RemoteEECN 0; 67: 10100 | 01 | 1 = 0xA3
  expect_be(m, 64, 0x000000A3, 4, "RemoteEECN|RemoteCMRespTO|TST|E2E");
  // 68: PSN; 71: 10011 | 110 = 0x9E
  expect_be(m, 68, 0x1234569E, 4, "StartingPSN|LocalCMRespTO|Retry");
  expect_be(m, 72, 0xFFFF, 2, "PKey");
  EXPECT_EQ(m[74], 0x57);  // MTU 5 | RDC 0 | RNR 7
  EXPECT_EQ(m[75], 0xF8);  // MaxCMRetries 15 | SRQ 1 | ext 0
  expect_be(m, 76, 0xFFFFFFFE, 4, "LIDs");
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(m[80 + i], 0x10 + i);
    EXPECT_EQ(m[96 + i], 0x30 + i);
  }
  // 112: flow label 0xABCDE in b31..12, reserved b11..b6, rate 0x2A in b5..0.
  expect_be(m, 112, (0xABCDEu << 12) | 0x2A, 4, "FlowLabel|PacketRate");
  EXPECT_EQ(m[116], 0x68);
  EXPECT_EQ(m[117], 64);
  EXPECT_EQ(m[118], 0x90);  // SL 9 | subnet local 0
  EXPECT_EQ(m[119], 19 << 3);
  for (int i = 120; i < 164; ++i) EXPECT_EQ(m[i], 0) << "alternate path byte " << i;
  for (int i = 0; i < 92; ++i) EXPECT_EQ(m[164 + i], i + 1);
  Req back;
  ASSERT_EQ(decode(m.data(), &back), Verdict::kOk);
  EXPECT_EQ(back.local_comm_id, r.local_comm_id);
  EXPECT_EQ(back.service_id, r.service_id);
  EXPECT_EQ(back.local_qpn, r.local_qpn);
  EXPECT_EQ(back.primary_flow_label, r.primary_flow_label);
  EXPECT_EQ(back.primary_local_ack_timeout, 19);
  EXPECT_EQ(back.private_data, r.private_data);
  EXPECT_EQ(back.max_cm_retries, 15);
  EXPECT_TRUE(back.srq);
}

TEST(MadEncode, RepBytesAtIbaOffsets) {
  Rep r;
  r.local_comm_id = 0xA1A2A3A4;
  r.remote_comm_id = 0xB1B2B3B4;
  r.local_qkey = 0;
  r.local_qpn = 0x654321;
  r.starting_psn = 0xFEDCBA;
  r.responder_resources = 16;
  r.initiator_depth = 8;
  r.target_ack_delay = 15;
  r.flow_control = true;
  r.rnr_retry_count = 5;
  r.srq = true;
  r.local_ca_guid = 0x0299887766554433ull;
  r.private_data[0] = 0xEE;
  r.private_data[195] = 0xDD;
  const Buf m = encode(r, 42);
  expect_header(m, 0x0013, 42);
  expect_be(m, 24, 0xA1A2A3A4, 4, "LocalCommID");
  expect_be(m, 28, 0xB1B2B3B4, 4, "RemoteCommID");
  expect_be(m, 32, 0, 4, "QKey");
  expect_be(m, 36, 0x65432100, 4, "LocalQPN");
  expect_be(m, 40, 0, 4, "EECN");
  expect_be(m, 44, 0xFEDCBA00, 4, "StartingPSN");
  EXPECT_EQ(m[48], 16);
  EXPECT_EQ(m[49], 8);
  EXPECT_EQ(m[50], (15 << 3) | 1);  // TargetACKDelay | failover 0 | E2E
  EXPECT_EQ(m[51], (5 << 5) | (1 << 4));
  expect_be(m, 52, 0x0299887766554433ull, 8, "LocalCAGUID");
  EXPECT_EQ(m[60], 0xEE);
  EXPECT_EQ(m[255], 0xDD);
  Rep back;
  ASSERT_EQ(decode(m.data(), &back), Verdict::kOk);
  EXPECT_EQ(back.local_qpn, 0x654321u);
  EXPECT_EQ(back.rnr_retry_count, 5);
  EXPECT_TRUE(back.srq);
  EXPECT_EQ(back.target_ack_delay, 15);
}

TEST(MadEncode, RtuRejDreqDrepMraSidrBytes) {
  Rtu t;
  t.local_comm_id = 0x01020304;
  t.remote_comm_id = 0x05060708;
  t.private_data[0] = 0x99;
  Buf m = encode(t, 7);
  expect_header(m, 0x0014, 7);
  expect_be(m, 24, 0x0102030405060708ull, 8, "RTU IDs");
  EXPECT_EQ(m[32], 0x99);

  Rej j;
  j.local_comm_id = 0;
  j.remote_comm_id = 0xCAFEBABE;
  j.message_rejected = 0;
  j.reject_info_length = 8;
  j.reason = 8;
  j.ari[0] = 0x42;
  j.private_data[0] = 0x77;
  m = encode(j, 9);
  expect_header(m, 0x0012, 9);
  expect_be(m, 24, 0, 4, "REJ local");
  expect_be(m, 28, 0xCAFEBABE, 4, "REJ remote");
  EXPECT_EQ(m[32], 0x00);
  EXPECT_EQ(m[33], 8 << 1);
  expect_be(m, 34, 8, 2, "REJ reason");
  EXPECT_EQ(m[36], 0x42);
  EXPECT_EQ(m[108], 0x77);
  j.message_rejected = 2;
  m = encode(j, 9);
  EXPECT_EQ(m[32], 0x80);

  Dreq d;
  d.local_comm_id = 0x11111111;
  d.remote_comm_id = 0x22222222;
  d.remote_qpn = 0xABCDEF;
  d.private_data[0] = 0x55;
  m = encode(d, 3);
  expect_header(m, 0x0015, 3);
  expect_be(m, 24, 0x1111111122222222ull, 8, "DREQ IDs");
  expect_be(m, 32, 0xABCDEF00, 4, "DREQ remote QPN");
  EXPECT_EQ(m[36], 0x55);

  Drep p;
  p.local_comm_id = 0x33333333;
  p.remote_comm_id = 0x44444444;
  p.private_data[223] = 0x66;
  m = encode(p, 4);
  expect_header(m, 0x0016, 4);
  expect_be(m, 24, 0x3333333344444444ull, 8, "DREP IDs");
  EXPECT_EQ(m[255], 0x66);

  Mra a;
  a.local_comm_id = 1;
  a.remote_comm_id = 2;
  a.message_mraed = 1;
  a.service_timeout = 24;
  m = encode(a, 5);
  expect_header(m, 0x0011, 5);
  EXPECT_EQ(m[32], 0x40);
  EXPECT_EQ(m[33], 24 << 3);

  SidrReq q;
  q.request_id = 0x0A0B0C0D;
  q.pkey = 0xFFFF;
  q.service_id = 0x0000000001111C06ull;
  m = encode(q, 6);
  expect_header(m, 0x0017, 6);
  expect_be(m, 24, 0x0A0B0C0D, 4, "RequestID");
  expect_be(m, 28, 0xFFFF0000, 4, "PKey|reserved");
  expect_be(m, 32, 0x0000000001111C06ull, 8, "ServiceID");

  SidrRep s;
  s.request_id = 0x0A0B0C0D;
  s.status = 1;
  s.qpn = 0x123456;
  s.service_id = 0x0000000001111C06ull;
  s.qkey = 0x01234567;
  m = encode(s, 6);
  expect_header(m, 0x0018, 6);
  EXPECT_EQ(m[28], 1);
  EXPECT_EQ(m[29], 0);
  expect_be(m, 32, 0x12345600, 4, "QPN");
  expect_be(m, 36, 0x0000000001111C06ull, 8, "ServiceID");
  expect_be(m, 44, 0x01234567, 4, "QKey");
}

TEST(MadParse, RefusesWhatNoCmSends) {
  Rtu t;
  Buf good = encode(t, 1);
  Header h;
  EXPECT_EQ(parse_header(good, &h), Verdict::kOk);
  EXPECT_EQ(parse_header(std::span<const uint8_t>(good.data(), 255), &h), Verdict::kBadSize);
  Buf b = good;
  b[0] = 2;
  EXPECT_EQ(parse_header(b, &h), Verdict::kBadBaseVersion);
  b = good;
  b[1] = 0x03;  // SA
  EXPECT_EQ(parse_header(b, &h), Verdict::kBadClass);
  b = good;
  b[2] = 1;
  EXPECT_EQ(parse_header(b, &h), Verdict::kBadClassVersion);
  b = good;
  b[3] = 0x01;  // Get
  EXPECT_EQ(parse_header(b, &h), Verdict::kUnsupported);
  b = good;
  b[17] = 0x19;  // LAP
  EXPECT_EQ(parse_header(b, &h), Verdict::kUnsupported);
  b = good;
  b[17] = 0x42;
  EXPECT_EQ(parse_header(b, &h), Verdict::kBadAttribute);
  // Field checks.
  Req r;
  r.path_mtu = 3;
  Buf q = encode(r, 1);
  Req out;
  EXPECT_EQ(decode(q.data(), &out), Verdict::kOk);
  q[74] = 0x07;  // MTU 0
  EXPECT_EQ(decode(q.data(), &out), Verdict::kBadField);
  q = encode(r, 1);
  q[67] = 0x04;  // transport type 2
  EXPECT_EQ(decode(q.data(), &out), Verdict::kBadField);
  Rej j;
  Buf rb = encode(j, 1);
  rb[33] = 73 << 1;
  Rej jo;
  EXPECT_EQ(decode(rb.data(), &jo), Verdict::kBadField);
}

TEST(MadParse, RandomBytesNeverCrash) {
  std::mt19937_64 rng(12);
  int ok = 0;
  for (int i = 0; i < 5000; ++i) {
    Buf b;
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    if (i % 2 == 0) {  // a valid header over random content
      b[0] = 1;
      b[1] = 7;
      b[2] = 2;
      b[3] = 3;
      b[16] = 0;
      b[17] = static_cast<uint8_t>(0x10 + rng() % 9);
    }
    Header h;
    if (parse_header(b, &h) != Verdict::kOk) continue;
    ++ok;
    Req a; Mra c; Rej d; Rep e; Rtu f; Dreq g; Drep k; SidrReq l; SidrRep n;
    (void)decode(b.data(), &a); (void)decode(b.data(), &c); (void)decode(b.data(), &d);
    (void)decode(b.data(), &e); (void)decode(b.data(), &f); (void)decode(b.data(), &g);
    (void)decode(b.data(), &k); (void)decode(b.data(), &l); (void)decode(b.data(), &n);
  }
  EXPECT_GT(ok, 1000);
}

}  // namespace
}  // namespace rnic::cm::mad

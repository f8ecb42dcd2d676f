// Views over IBA transport headers (BTH, RETH, AETH, AtomicETH, AtomicAckETH, DETH, XRCETH,
// ImmDt, IETH, FETH) with big-endian get/set accessors named as in the spec, plus header sizes and
// AETH syndrome helpers. A view only wraps a pointer: the caller guarantees the header's bytes
// are in bounds (parse_roce() does that once). Hdr<const uint8_t> views are read-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "wire/byteorder.h"

namespace rnic::wire {

constexpr size_t kBthBytes = 12;
constexpr size_t kRethBytes = 16;
constexpr size_t kAethBytes = 4;
constexpr size_t kAtomicEthBytes = 28;
constexpr size_t kAtomicAckEthBytes = 8;
constexpr size_t kDethBytes = 8;
constexpr size_t kImmDtBytes = 4;
constexpr size_t kIethBytes = 4;
constexpr size_t kFethBytes = 4;
constexpr size_t kXrcEthBytes = 4;
constexpr size_t kCnpRsvdBytes = 16;
constexpr size_t kIcrcBytes = 4;
constexpr uint16_t kRoceUdpPort = 4791;
constexpr uint16_t kDefaultPkey = 0xffff;
constexpr uint8_t kTver = 0;
// softrnic's own: a request whose payload is a one-copy descriptor (emu/transport/one_copy.h),
// sent only between two devices of one host that agreed to it. Real RNICs drop TVer != 0.
constexpr uint8_t kTverOneCopy = 1;
constexpr size_t kIpv4HdrBytes = 20;
constexpr size_t kIpv6HdrBytes = 40;
constexpr size_t kUdpHdrBytes = 8;
constexpr size_t kEthHdrBytes = 14;

// Base for all views: P is uint8_t (mutable) or const uint8_t (read-only).
template <typename P>
class HdrView {
 public:
  constexpr explicit HdrView(P* p) : p_(p) {}
  constexpr P* data() const { return p_; }

 protected:
  static constexpr bool kMutable = !std::is_const_v<P>;
  P* p_;
};

// Base Transport Header (12 bytes).
//  0: opcode | 1: SE M PadCnt(2) TVer(4) | 2-3: P_Key | 4: FECN BECN resv6 | 5-7: DestQP
//  8: AckReq resv7 | 9-11: PSN
template <typename P>
class BthT : public HdrView<P> {
  using HdrView<P>::p_;

 public:
  using HdrView<P>::HdrView;
  constexpr uint8_t opcode() const { return p_[0]; }
  constexpr bool se() const { return p_[1] & 0x80; }
  constexpr bool mig() const { return p_[1] & 0x40; }
  constexpr uint8_t pad_cnt() const { return (p_[1] >> 4) & 0x3; }
  constexpr uint8_t tver() const { return p_[1] & 0xf; }
  constexpr uint16_t pkey() const { return load_be16(p_ + 2); }
  constexpr bool fecn() const { return p_[4] & 0x80; }
  constexpr bool becn() const { return p_[4] & 0x40; }
  constexpr uint8_t resv8a() const { return p_[4]; }  // whole byte 4 (masked in the ICRC)
  constexpr uint32_t dest_qp() const { return load_be24(p_ + 5); }
  constexpr bool ack_req() const { return p_[8] & 0x80; }
  constexpr uint32_t psn() const { return load_be24(p_ + 9); }

  constexpr void set_opcode(uint8_t v) requires(!std::is_const_v<P>) { p_[0] = v; }
  constexpr void set_se(bool v) requires(!std::is_const_v<P>) { set_bit(1, 0x80, v); }
  constexpr void set_mig(bool v) requires(!std::is_const_v<P>) { set_bit(1, 0x40, v); }
  constexpr void set_pad_cnt(uint8_t v) requires(!std::is_const_v<P>) {
    p_[1] = static_cast<uint8_t>((p_[1] & ~0x30) | ((v & 0x3) << 4));
  }
  constexpr void set_tver(uint8_t v) requires(!std::is_const_v<P>) {
    p_[1] = static_cast<uint8_t>((p_[1] & ~0x0f) | (v & 0xf));
  }
  constexpr void set_pkey(uint16_t v) requires(!std::is_const_v<P>) { store_be16(p_ + 2, v); }
  constexpr void set_fecn(bool v) requires(!std::is_const_v<P>) { set_bit(4, 0x80, v); }
  constexpr void set_becn(bool v) requires(!std::is_const_v<P>) { set_bit(4, 0x40, v); }
  constexpr void set_dest_qp(uint32_t v) requires(!std::is_const_v<P>) { store_be24(p_ + 5, v); }
  constexpr void set_ack_req(bool v) requires(!std::is_const_v<P>) { set_bit(8, 0x80, v); }
  constexpr void set_psn(uint32_t v) requires(!std::is_const_v<P>) { store_be24(p_ + 9, v); }

 private:
  constexpr void set_bit(int byte, uint8_t bit, bool v) requires(!std::is_const_v<P>) {
    p_[byte] = static_cast<uint8_t>(v ? (p_[byte] | bit) : (p_[byte] & ~bit));
  }
};

// RDMA Extended Transport Header (16 bytes): VA(8) R_Key(4) DMA Length(4).
template <typename P>
class RethT : public HdrView<P> {
  using HdrView<P>::p_;

 public:
  using HdrView<P>::HdrView;
  constexpr uint64_t va() const { return load_be64(p_); }
  constexpr uint32_t rkey() const { return load_be32(p_ + 8); }
  constexpr uint32_t dma_len() const { return load_be32(p_ + 12); }
  constexpr void set_va(uint64_t v) requires(!std::is_const_v<P>) { store_be64(p_, v); }
  constexpr void set_rkey(uint32_t v) requires(!std::is_const_v<P>) { store_be32(p_ + 8, v); }
  constexpr void set_dma_len(uint32_t v) requires(!std::is_const_v<P>) { store_be32(p_ + 12, v); }
};

// ACK Extended Transport Header (4 bytes): Syndrome(1) MSN(3).
template <typename P>
class AethT : public HdrView<P> {
  using HdrView<P>::p_;

 public:
  using HdrView<P>::HdrView;
  constexpr uint8_t syndrome() const { return p_[0]; }
  constexpr uint32_t msn() const { return load_be24(p_ + 1); }
  constexpr void set_syndrome(uint8_t v) requires(!std::is_const_v<P>) { p_[0] = v; }
  constexpr void set_msn(uint32_t v) requires(!std::is_const_v<P>) { store_be24(p_ + 1, v); }
};

// Atomic Extended Transport Header (28 bytes): VA(8) R_Key(4) SwapOrAddData(8) CompareData(8).
template <typename P>
class AtomicEthT : public HdrView<P> {
  using HdrView<P>::p_;

 public:
  using HdrView<P>::HdrView;
  constexpr uint64_t va() const { return load_be64(p_); }
  constexpr uint32_t rkey() const { return load_be32(p_ + 8); }
  constexpr uint64_t swap_add() const { return load_be64(p_ + 12); }
  constexpr uint64_t compare() const { return load_be64(p_ + 20); }
  constexpr void set_va(uint64_t v) requires(!std::is_const_v<P>) { store_be64(p_, v); }
  constexpr void set_rkey(uint32_t v) requires(!std::is_const_v<P>) { store_be32(p_ + 8, v); }
  constexpr void set_swap_add(uint64_t v) requires(!std::is_const_v<P>) { store_be64(p_ + 12, v); }
  constexpr void set_compare(uint64_t v) requires(!std::is_const_v<P>) { store_be64(p_ + 20, v); }
};

// Atomic ACK Extended Transport Header (8 bytes): OriginalRemoteData(8).
template <typename P>
class AtomicAckEthT : public HdrView<P> {
  using HdrView<P>::p_;

 public:
  using HdrView<P>::HdrView;
  constexpr uint64_t orig() const { return load_be64(p_); }
  constexpr void set_orig(uint64_t v) requires(!std::is_const_v<P>) { store_be64(p_, v); }
};

// Datagram Extended Transport Header (8 bytes): Q_Key(4) resv8 SrcQP(3).
template <typename P>
class DethT : public HdrView<P> {
  using HdrView<P>::p_;

 public:
  using HdrView<P>::HdrView;
  constexpr uint32_t qkey() const { return load_be32(p_); }
  constexpr uint32_t src_qp() const { return load_be24(p_ + 5); }
  constexpr void set_qkey(uint32_t v) requires(!std::is_const_v<P>) { store_be32(p_, v); }
  constexpr void set_src_qp(uint32_t v) requires(!std::is_const_v<P>) {
    p_[4] = 0;
    store_be24(p_ + 5, v);
  }
};

// XRC Extended Transport Header (4 bytes, IBA 9.3.6 / Table 37): resv8, XRC SRQ number (24
// bits): the SRQ of the target's XRC domain that receives the request.
template <typename P>
class XrcEthT : public HdrView<P> {
  using HdrView<P>::p_;

 public:
  using HdrView<P>::HdrView;
  constexpr uint32_t srqn() const { return load_be24(p_ + 1); }
  constexpr void set_srqn(uint32_t v) requires(!std::is_const_v<P>) {
    p_[0] = 0;
    store_be24(p_ + 1, v);
  }
};

// Immediate Data Extended Transport Header (4 bytes). imm() is the big-endian load of the
// 4 wire bytes (ibverbs' __be32 imm_data is the same bytes in memory order).
template <typename P>
class ImmDtT : public HdrView<P> {
  using HdrView<P>::p_;

 public:
  using HdrView<P>::HdrView;
  constexpr uint32_t imm() const { return load_be32(p_); }
  constexpr void set_imm(uint32_t v) requires(!std::is_const_v<P>) { store_be32(p_, v); }
};

// Invalidate Extended Transport Header (4 bytes): R_Key to invalidate.
template <typename P>
class IethT : public HdrView<P> {
  using HdrView<P>::p_;

 public:
  using HdrView<P>::HdrView;
  constexpr uint32_t inv_rkey() const { return load_be32(p_); }
  constexpr uint32_t rkey() const { return inv_rkey(); }
  constexpr void set_inv_rkey(uint32_t v) requires(!std::is_const_v<P>) { store_be32(p_, v); }
  constexpr void set_rkey(uint32_t v) requires(!std::is_const_v<P>) { set_inv_rkey(v); }
};

// FLUSH Extended Transport Header (4 bytes): reserved(26) SEL(2) PLT(4), as in rxe.
template <typename P>
class FethT : public HdrView<P> {
  using HdrView<P>::p_;

 public:
  using HdrView<P>::HdrView;
  constexpr uint32_t raw() const { return load_be32(p_); }
  constexpr uint8_t sel() const { return (p_[3] >> 4) & 0x3; }   // selectivity level
  constexpr uint8_t plt() const { return p_[3] & 0xf; }          // placement type
  constexpr void set_raw(uint32_t v) requires(!std::is_const_v<P>) { store_be32(p_, v); }
  constexpr void set_sel_plt(uint8_t sel, uint8_t plt) requires(!std::is_const_v<P>) {
    store_be32(p_, (uint32_t{sel} & 0x3) << 4 | (plt & 0xfu));
  }
};

using Bth = BthT<uint8_t>;
using Reth = RethT<uint8_t>;
using Aeth = AethT<uint8_t>;
using AtomicEth = AtomicEthT<uint8_t>;
using AtomicAckEth = AtomicAckEthT<uint8_t>;
using Deth = DethT<uint8_t>;
using ImmDt = ImmDtT<uint8_t>;
using Ieth = IethT<uint8_t>;
using Feth = FethT<uint8_t>;
using XrcEth = XrcEthT<uint8_t>;
using ConstBth = BthT<const uint8_t>;
using ConstReth = RethT<const uint8_t>;
using ConstAeth = AethT<const uint8_t>;
using ConstAtomicEth = AtomicEthT<const uint8_t>;
using ConstAtomicAckEth = AtomicAckEthT<const uint8_t>;
using ConstDeth = DethT<const uint8_t>;
using ConstImmDt = ImmDtT<const uint8_t>;
using ConstIeth = IethT<const uint8_t>;
using ConstFeth = FethT<const uint8_t>;
using ConstXrcEth = XrcEthT<const uint8_t>;

// AETH syndrome (IBA 9.7.5.2.4): bit 7 reserved, bits 6-5 type, bits 4-0 value.
namespace aeth {
constexpr uint8_t kTypeMask = 0x60;
constexpr uint8_t kValueMask = 0x1f;
constexpr uint8_t kTypeAck = 0x00;
constexpr uint8_t kTypeRnrNak = 0x20;
constexpr uint8_t kTypeReserved = 0x40;
constexpr uint8_t kTypeNak = 0x60;
constexpr uint8_t kCreditInvalid = 0x1f;  // ACK credit field "invalid" (no credits advertised)
// NAK codes (value bits when type == NAK)
constexpr uint8_t kNakPsnSeqError = 0;
constexpr uint8_t kNakInvalidRequest = 1;
constexpr uint8_t kNakRemoteAccessError = 2;
constexpr uint8_t kNakRemoteOperationalError = 3;
constexpr uint8_t kNakInvalidRdRequest = 4;

constexpr uint8_t type(uint8_t syndrome) { return syndrome & kTypeMask; }
constexpr uint8_t value(uint8_t syndrome) { return syndrome & kValueMask; }
constexpr bool is_ack(uint8_t s) { return type(s) == kTypeAck; }
constexpr bool is_rnr_nak(uint8_t s) { return type(s) == kTypeRnrNak; }
constexpr bool is_nak(uint8_t s) { return type(s) == kTypeNak; }
constexpr uint8_t ack(uint8_t credits) { return kTypeAck | (credits & kValueMask); }
constexpr uint8_t rnr_nak(uint8_t timer_code) { return kTypeRnrNak | (timer_code & kValueMask); }
constexpr uint8_t nak(uint8_t code) { return kTypeNak | (code & kValueMask); }
}  // namespace aeth

}  // namespace rnic::wire

// emu/objects/param.h: the device limits softrnic reports and enforces (ibv_query_device), chosen
// like current rxe (rxe_param.h), plus identity constants (vendor id, part id).
#pragma once

#include <cstdint>

namespace rnic::emu {

// Identity. IB vendor ids are IEEE OUIs (24 bits). 0x02534E has the "locally administered"
// bit (0x02 in the first octet) set, so the IEEE can never assign it to a real vendor;
// none of mlx5 (0x02c9, 0x119f), efa (0x1d0f), hns (0x19e5), bnxt (0x14e4), irdma (0x8086),
// qedr (0x1077), cxgb4 (0x1425), rxe (0xffffff) or siw (0x626d74) use it, and perftest's
// vendor table therefore falls through to its generic defaults. Bytes 53 4E read "SN".
inline constexpr uint32_t kVendorId = 0x02534E;
inline constexpr uint32_t kVendorPartId = 0x5352;  // "SR"
inline constexpr uint32_t kHwVer = 1;
inline constexpr const char* kFwVer = "0.1.0";
inline constexpr const char* kDefaultDeviceName = "softrnic0";

// Limits (rxe_param.h, DEFAULT_MAX_VALUE-era where sane for a user-space emulator).
inline constexpr uint64_t kMaxMrSize = ~uint64_t{0};
inline constexpr uint64_t kPageSizeCap = 0xFFFFF000;
inline constexpr uint32_t kMaxQp = 0x10000;
inline constexpr uint32_t kMaxQpWr = 0x4000;
inline constexpr uint32_t kMaxSge = 32;
inline constexpr uint32_t kMaxSgeRd = 32;
inline constexpr uint32_t kMaxInlineData = 400;
inline constexpr uint32_t kMaxCq = 0x4000;
inline constexpr uint32_t kMaxCqe = 32767;  // 2^15 - 1
inline constexpr uint32_t kMaxMr = 0x40000;
inline constexpr uint32_t kMaxMw = 0x40000;
inline constexpr uint32_t kMaxPd = 0x7FFC;
inline constexpr uint32_t kMaxQpRdAtom = 128;
inline constexpr uint32_t kMaxQpInitRdAtom = 128;
inline constexpr uint32_t kMaxResRdAtom = 0x3F000;
inline constexpr uint32_t kMaxAh = 32767;
inline constexpr uint32_t kMaxSrq = 960;
inline constexpr uint32_t kMaxXrcd = 1024;  // XRC domains per device
inline constexpr uint32_t kMaxSrqWr = 0x4000;
inline constexpr uint32_t kMaxSrqSge = 27;
// UD multicast: each group is one joined UDP socket (wire/udp_port.h kMaxGroups = 64).
inline constexpr uint32_t kMaxMcastGrp = 64;
inline constexpr uint32_t kMaxMcastQpAttach = 56;
inline constexpr uint32_t kMaxTotalMcastQpAttach = kMaxMcastGrp * kMaxMcastQpAttach;
inline constexpr uint16_t kMaxPkeys = 1;
inline constexpr uint8_t kLocalCaAckDelay = 15;
inline constexpr uint32_t kMaxCompVectors = 1;

// Port.
inline constexpr uint8_t kNumPorts = 1;
inline constexpr uint32_t kPortMaxMsgSz = 0x80000000u;  // 2 GiB (IBA max message)
inline constexpr uint32_t kGidTableLen = 16;  // most GIDs listed (device.h gid_table_for)
// The port's gid_tbl_len: its slots, populated or not (rxe's RXE_PORT_GID_TBL_LEN). Slots past
// the listed GIDs are empty: query_gid answers EINVAL, the verbs a zero GID / ENODATA.
inline constexpr int kGidTableSlots = 1024;
inline constexpr uint16_t kPkeyTableLen = 1;            // the single entry 0xFFFF
inline constexpr uint16_t kDefaultPkey = 0xFFFF;
// Port capability bits: CM_SUP (1<<16) | IP_BASED_GIDS (1<<26), as a RoCE port reports.
inline constexpr uint32_t kPortCapFlags = (1u << 16) | (1u << 26);
// Bytes of RoCEv2 headers that must fit in the interface MTU beside the IB payload when
// picking active_mtu (IPv4 20 + UDP 8 + BTH 12 + largest extension 28 + ICRC 4, rounded up
// as rxe does): 1500 -> 1024, 9000 -> 4096, lo 65536 -> 4096.
inline constexpr uint32_t kRoceHeaderOverhead = 80;

// Well-known Q_Key of QP1 (GSI) and the controlled Q_Key bit (IBA 10.2.4).
inline constexpr uint32_t kGsiQkey = 0x80010000;

}  // namespace rnic::emu

// base/config.cc: the table of every environment variable, its one parser, the unknown-name
// warning and the generated documentation table (contract in base/config.h).
#include "base/config.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace rnic::base {
namespace {

constexpr std::string_view kPrefix = "SOFTRNIC_";

// Store helpers: one per Config field (captureless lambdas decay to the table's pointer).
using Store = void (*)(Config*, const VarValue&);

const VarDecl kVars[] = {
    {.name = "SOFTRNIC_NAME", .type = VarType::kName, .default_text = "`softrnic0`",
     .values = "1..63 characters of `[A-Za-z0-9_.-]`", .help = "device name", .reader = "shim",
     .empty_is_error = true,
     .store = [](Config* c, const VarValue& v) { c->name = v.s; c->name_set = true; }},
    {.name = "SOFTRNIC_IP", .type = VarType::kIp,
     .default_text = "first free of 127.0.0.2..254",
     .values = "a unicast IPv4 or IPv6 address (link-local: `fe80::1%eth0`)",
     .help = "address of the device (GID 0; its interface's other addresses follow, "
             "each with its own UDP 4791 socket)",
     .reader = "shim", .empty_is_error = true,
     .store = [](Config* c, const VarValue& v) { c->ip = v.s; }},
    {.name = "SOFTRNIC_MTU", .type = VarType::kU32,
     .default_text = "from the interface (loopback: 4096)", .values = "256, 512, 1024, 2048, 4096",
     .help = "active path MTU", .reader = "shim", .empty_is_error = true, .min = 256,
     .max = 4096, .pow2 = true,
     .store = [](Config* c, const VarValue& v) { c->mtu = static_cast<uint32_t>(v.u); }},
    {.name = "SOFTRNIC_GSO", .type = VarType::kEnum, .default_text = "`auto`",
     .values = "`auto`, `on`, `off`",
     .help = "UDP GSO batches on send; auto: only when the IP is on a loopback interface, "
             "where a batch is never cut (docs/wire.md §4). Receiving with GRO is always on",
     .reader = "shim", .choices = "auto,on/1/yes,off/0/no",
     .store = [](Config* c, const VarValue& v) { c->gso = static_cast<GsoMode>(v.u); }},
    {.name = "SOFTRNIC_HOSTING", .type = VarType::kEnum, .default_text = "`auto`",
     .values = "`auto`, `daemon`, `embedded`",
     .help = "auto: the softrnicd of SOFTRNIC_RUNTIME_DIR (or /run/softrnic) when one answers, "
             "else the device inside this process; daemon: softrnicd or no device (docs/daemon.md)",
     .reader = "shim", .choices = "auto,daemon,embedded",
     .store = [](Config* c, const VarValue& v) { c->hosting = static_cast<Hosting>(v.u); }},
    {.name = "SOFTRNIC_PIN", .type = VarType::kEnum, .default_text = "`shadow`",
     .values = "`shadow`, `direct`",
     .help = "shadow: the device keeps its own mapping of registered pages, so memory mapped "
             "later at a registered address is never served to an old rkey (emu/objects/pin.h); "
             "direct: the device reads and writes the application's addresses",
     .reader = "shim", .choices = "shadow,direct",
     .store = [](Config* c, const VarValue& v) { c->pin = static_cast<PinMode>(v.u); }},
    {.name = "SOFTRNIC_SPIN_US", .type = VarType::kU32, .default_text = "`20`",
     .values = "0..10000 (us)",
     .help = "how long the progress thread keeps polling its socket after the last packet "
             "before it sleeps in epoll, when a core is spare: it sleeps at once while the "
             "machine's runnable threads fill the CPUs (counter spin_skipped), since a spin "
             "then takes the application's core (0: always sleep)",
     .reader = "shim", .empty_is_error = true, .min = 0, .max = 10000,
     .store = [](Config* c, const VarValue& v) { c->spin_us = static_cast<uint32_t>(v.u); }},
    {.name = "SOFTRNIC_BUSY_POLL_US", .type = VarType::kU32, .default_text = "`2000`",
     .values = "0..10000 (us)",
     .help = "busy-poll hand-off: while the application polls empty CQs back to back (at most "
             "50 us apart), its polls receive and run the timers, and the progress thread "
             "sleeps; it takes receive back when a QP's last work request completes with no "
             "answer in, when the application waits for a completion event or calls rdma_cm, "
             "and at the latest this long after the polls stop, unless an application "
             "thread is inside a call of ours (a poll's receive, a post) or the thread that "
             "polled last waits for a CPU: then it looks again, for up to 4 such times more "
             "(counter busy_poll_lease_kept) (0: the progress thread always receives; "
             "docs/progress.md)",
     .reader = "shim", .empty_is_error = true, .min = 0, .max = 10000,
     .store = [](Config* c, const VarValue& v) { c->busy_poll_us = static_cast<uint32_t>(v.u); }},
    {.name = "SOFTRNIC_BUSY_POLL_LATE", .type = VarType::kU32, .default_text = "`1`",
     .values = "0..64 (polls)",
     .help = "busy-poll hand-off: this many empty polls a lease (SOFTRNIC_BUSY_POLL_US) that "
             "come more than 50 us after the application's last call keep receive with the "
             "polls (mostly the application thread was preempted, not gone); the next one "
             "hands it back to the progress thread (counter busy_poll_late_forgiven; 0: every "
             "late poll hands receive back; docs/progress.md)",
     .reader = "shim", .empty_is_error = true, .min = 0, .max = 64,
     .store = [](Config* c, const VarValue& v) { c->busy_poll_late = static_cast<uint32_t>(v.u); }},
    {.name = "SOFTRNIC_TX_DEFER", .type = VarType::kU32, .default_text = "`1`",
     .values = "0..4096 (packets)",
     .help = "doorbell batching: a post to an RC or XRC QP with at least this many packets "
             "unacknowledged leaves its work requests for the next ACK, which sends all "
             "queued ones in one batch (at most 64 wait; counter tx_deferred); on 2 cores "
             "64 B ib_send_bw 5x, ib_write_bw 1.8x, latency unchanged (docs/progress.md; "
             "0: every post sends at once)",
     .reader = "shim", .empty_is_error = true, .min = 0, .max = 4096,
     .store = [](Config* c, const VarValue& v) { c->tx_defer = static_cast<uint32_t>(v.u); }},
    {.name = "SOFTRNIC_ACK_HOLD_US", .type = VarType::kU32, .default_text = "`50`",
     .values = "0..150 (microseconds)",
     .help = "ACKs ride posts: an ACK owed at the end of a receive that an application's "
             "poll_cq ran (or the progress thread, while the application's last call was less "
             "than 50 us ago) waits this long for the QP's next requester run (a post), once the "
             "QP's application answers within it, and goes in that run's batch ahead of its "
             "requests (else alone, at once when the application enters the CM or waits in "
             "ibv_get_cq_event; counters ack_on_post, ack_hold_expired); on 2 cores "
             "ib_send_lat -20% (docs/progress.md; 0: every ACK goes when its receive batch "
             "ends; at most 150, below the 200 us probe timer)",
     .reader = "shim", .empty_is_error = true, .min = 0, .max = 150,
     .store = [](Config* c, const VarValue& v) { c->ack_hold_us = static_cast<uint32_t>(v.u); }},
    {.name = "SOFTRNIC_ACK_TAIL", .type = VarType::kBool, .default_text = "`1`",
     .values = "`0`, `1`",
     .help = "with SOFTRNIC_ACK_HOLD_US and UDP GSO: an ACK that rides a post goes as the "
             "short last segment of the post's GSO datagram, so a ping-pong's answer and the "
             "ACK before it cross the stack as one datagram; the receiver handles the ACK "
             "first. Off while capture or faults are attached; on 2 cores ib_send_lat and "
             "ib_write_lat typical -17% (docs/progress.md; 0: the ACK goes as a datagram of its "
             "own ahead of the requests)",
     .reader = "shim", .empty_is_error = true,
     .store = [](Config* c, const VarValue& v) { c->ack_tail = v.b; }},
    {.name = "SOFTRNIC_LINGER_US", .type = VarType::kU32, .default_text = "`5`",
     .values = "0..100 (microseconds)",
     .help = "with SOFTRNIC_ACK_HOLD_US: a poll_cq that received the ACK completing the last "
             "work request of a ping-pong's QP waits this long for the peer's answer behind "
             "it before it returns, so that an application that then waits on memory "
             "(ib_write_lat) finds it there (counters linger_hit, linger_expired); on 2 cores "
             "ib_write_lat p99 1.3-2 ms to 65-96 us (docs/progress.md; 0: never)",
     .reader = "shim", .empty_is_error = true, .min = 0, .max = 100,
     .store = [](Config* c, const VarValue& v) { c->linger_us = static_cast<uint32_t>(v.u); }},
    {.name = "SOFTRNIC_RX_MARK_PCT", .type = VarType::kU32, .default_text = "`85`",
     .values = "0..100 (percent)",
     .help = "the receive socket as a congestion point: a receive batch that comes back full "
             "looks at how full the socket is (SO_MEMINFO), and at or above this percent of "
             "its buffer every RC/UC request in that batch draws a CNP to its QP as if ECN "
             "CE-marked (at most one per QP per 50 us; counter rx_backlog_marks), so RC QPs "
             "sending into one receiver halve their windows before the kernel drops; on 2 "
             "cores, 64 KiB: ib_send_bw -q 8 and -q 16 3-4x fewer kernel drops and +10-18%, "
             "ib_write_bw -q 16 4-8x fewer, -q 4 never marked; lower marks cut -q 4 "
             "ib_write_bw by 2-8% (60) or 5% (15) (docs/congestion.md §3; 0: never)",
     .reader = "shim", .empty_is_error = true, .min = 0, .max = 100,
     .store = [](Config* c, const VarValue& v) { c->rx_mark_pct = static_cast<uint32_t>(v.u); }},
    {.name = "SOFTRNIC_WINDOW_SHARE", .type = VarType::kBool, .default_text = "`1`",
     .values = "`0`, `1`",
     .help = "RC QPs of one device whose windows fill towards one destination address share "
             "one window of 512 PSNs between them (each at least 32; counted per 1 ms epoch), "
             "so that four QPs into one receiver do not queue four windows in its socket; one "
             "QP keeps the whole window; on 2 cores, 64 KiB: ib_send_bw -q 4 +2-10%, -q 16 "
             "+9-11% with no kernel drops (~900 in 3 s without), ib_write_bw -q 4 +0-8%, -q 1 "
             "unchanged (docs/congestion.md §3; 0: each QP's window is its own)",
     .reader = "shim", .empty_is_error = true,
     .store = [](Config* c, const VarValue& v) { c->window_share = v.b; }},
    {.name = "SOFTRNIC_ONE_COPY", .type = VarType::kBool, .default_text = "`0`",
     .values = "`0`, `1`",
     .help = "1 at both ends: RC SEND and WRITE payloads between two devices of one host and one "
             "user go as descriptors of the sender's registered pages, which the receiving device "
             "copies straight from a read-only mapping of them: one copy instead of four "
             "(emu/transport/one_copy.h; embedded hosting, SOFTRNIC_PIN=shadow; a sender with "
             "capture or faults sends by value; counters one_copy_tx, one_copy_rx, drop_one_copy)",
     .reader = "shim",
     .store = [](Config* c, const VarValue& v) { c->one_copy = v.b; }},
    {.name = "SOFTRNIC_LOG", .type = VarType::kLevel, .default_text = "`error`",
     .values = "`off`, `error`, `warn`, `info`, `debug`, `trace` or 0..5",
     .help = "log threshold (stderr or SOFTRNIC_LOG_FILE, never stdout)", .reader = "shim",
     .empty_is_error = true,
     .store = [](Config* c, const VarValue& v) { c->log = v.level; }},
    {.name = "SOFTRNIC_LOG_FILE", .type = VarType::kPath, .default_text = "stderr",
     .values = "a file path", .help = "append log lines to this file instead of stderr",
     .reader = "shim",
     .store = [](Config* c, const VarValue& v) { c->log_file = v.s; }},
    {.name = "SOFTRNIC_PCAP", .type = VarType::kPath, .default_text = "off",
     .values = "a file path (`%p` -> pid)",
     .help = "capture every packet sent and received to a pcap", .reader = "services",
     .empty_is_error = true,
     .store = [](Config* c, const VarValue& v) { c->pcap = v.s; }},
    {.name = "SOFTRNIC_STATS_AT_EXIT", .type = VarType::kPath, .default_text = "off",
     .values = "a file path (`%p` -> pid)",
     .help = "at device close, write the device's `softrnic-ctl stats` counters to this file "
             "(written whole, then renamed into place)",
     .reader = "services", .empty_is_error = true,
     .store = [](Config* c, const VarValue& v) { c->stats_at_exit = v.s; }},
    {.name = "SOFTRNIC_FAULTS", .type = VarType::kString, .default_text = "none",
     .values = "rules of `emu/fault/fault_rules.h`, `;`-separated",
     .help = "fault plan, inline", .reader = "services",
     .store = [](Config* c, const VarValue& v) { c->faults = v.s; }},
    {.name = "SOFTRNIC_FAULTS_FILE", .type = VarType::kPath, .default_text = "none",
     .values = "a file path", .help = "fault plan, from a file", .reader = "services",
     .store = [](Config* c, const VarValue& v) { c->faults_file = v.s; }},
    {.name = "SOFTRNIC_FAULT_SEED", .type = VarType::kSeed, .default_text = "1",
     .values = "decimal or 0x-hex 64-bit (`010` is ten, never octal)",
     .help = "seed of the plan (same plan + seed + traffic -> same trace)", .reader = "services",
     .store = [](Config* c, const VarValue& v) { c->fault_seed = v.u; }},
    {.name = "SOFTRNIC_FAULT_TRACE", .type = VarType::kPath, .default_text = "none",
     .values = "a file path", .help = "file receiving one line per fault firing",
     .reader = "services",
     .store = [](Config* c, const VarValue& v) { c->fault_trace = v.s; }},
    {.name = "SOFTRNIC_SECURE_KEYS", .type = VarType::kBool, .default_text = "`0`",
     .values = "`0`, `1`",
     .help = "1: fully random 32-bit lkeys/rkeys, no visible index (0: index << 8 and a random "
             "byte, as rxe)",
     .reader = "services",
     .store = [](Config* c, const VarValue& v) { c->secure_keys = v.b; }},
    {.name = "SOFTRNIC_STRICT_SRC", .type = VarType::kBool, .default_text = "`0`",
     .values = "`0`, `1`",
     .help = "1: packets for a connected RC/UC QP must come from its peer's IP and the UDP "
             "source port first seen from it",
     .reader = "services",
     .store = [](Config* c, const VarValue& v) { c->strict_src = v.b; }},
    {.name = "SOFTRNIC_RC_STASH", .type = VarType::kBool, .default_text = "`1`",
     .values = "`0`, `1`",
     .help = "1: an RC responder keeps SEND/WRITE packets arriving after a lost one and executes "
             "them once it is resent (one resend per loss); 0: in order only, as ConnectX and rxe",
     .reader = "services",
     .store = [](Config* c, const VarValue& v) { c->rc_stash = v.b; }},
    {.name = "SOFTRNIC_STRICT_SRC_PORT", .type = VarType::kU32, .default_text = "none",
     .values = "a UDP port 1..65535, e.g. 4791",
     .help = "the fixed UDP source port the peer must use; implies SOFTRNIC_STRICT_SRC=1",
     .reader = "services", .empty_is_error = true, .min = 1, .max = 65535,
     .store = [](Config* c, const VarValue& v) { c->strict_src_port = static_cast<uint16_t>(v.u); }},
    {.name = "SOFTRNIC_CONTROL", .type = VarType::kEnum, .default_text = "`on`",
     .values = "`on`, `off`, `required`", .help = "the per-process control socket",
     .reader = "services", .choices = "on/1/yes,off/0/no,required",
     .store = [](Config* c, const VarValue& v) { c->control = static_cast<ControlSocket>(v.u); }},
    {.name = "SOFTRNIC_CM_MAX_WAIT_MS", .type = VarType::kU32, .default_text = "none",
     .values = "1..3600000 (ms)",
     .help = "cap on every CM wait (REQ/REP/DREQ/SIDR retries, MRA, timewait; IBA/Linux values "
             "otherwise): for tests of timeouts",
     .reader = "cm", .empty_is_error = true, .min = 1, .max = 3600000,
     .store = [](Config* c, const VarValue& v) { c->cm_max_wait_ms = static_cast<uint32_t>(v.u); }},
    {.name = "SOFTRNIC_RUNTIME_DIR", .type = VarType::kPath,
     .default_text = "`$XDG_RUNTIME_DIR/softrnic` or `/tmp/softrnic-$UID`",
     .values = "a directory (mode 0700)", .help = "control sockets and the generated sysfs tree",
     .reader = "control, tools",
     .store = [](Config* c, const VarValue& v) { c->runtime_dir = v.s; }},
    {.name = "XDG_RUNTIME_DIR", .type = VarType::kPath, .default_text = "unset",
     .values = "a directory", .help = "standard; base of the default SOFTRNIC_RUNTIME_DIR",
     .reader = "control, tools",
     .store = [](Config* c, const VarValue& v) { c->xdg_runtime_dir = v.s; }},
    {.name = "SYSFS_PATH", .type = VarType::kPath, .default_text = "`/sys`",
     .values = "a directory", .help = "sysfs root the device reports (`softrnic run` sets it)",
     .reader = "shim, pathmap",
     .store = [](Config* c, const VarValue& v) { c->sysfs_path = v.s; }},
    {.name = "SOFTRNIC_SHIM_DIR", .type = VarType::kPath, .default_text = "`build/verbs_shim`",
     .values = "a directory", .help = "where `scripts/softrnic` finds libibverbs.so.1",
     .reader = "scripts"},
    {.name = "SOFTRNIC_CTL", .type = VarType::kPath, .default_text = "`build/tools/softrnic-ctl`",
     .values = "a file path", .help = "the softrnic-ctl `scripts/softrnic` runs",
     .reader = "scripts"},
    {.name = "SOFTRNIC_BUILD_DIR", .type = VarType::kPath, .default_text = "`build`",
     .values = "a directory", .help = "build directory of `scripts/demo` and `scripts/bench`",
     .reader = "scripts"},
    {.name = "SOFTRNIC_TEST_QUICK", .type = VarType::kString, .default_text = "unset",
     .values = "any non-empty value", .help = "`scripts/test` skips the sanitizer build",
     .reader = "scripts"},
};

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
char upper(char c) { return (c >= 'a' && c <= 'z') ? static_cast<char>(c - 'a' + 'A') : c; }

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

std::string lowered(std::string_view s) {
  std::string o(s);
  for (char& c : o) c = lower(c);
  return o;
}

// Removes Markdown backticks for the plain-text table.
std::string plain(std::string_view s) {
  std::string o;
  for (char c : s)
    if (c != '`') o += c;
  return o;
}

bool valid_name(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-' || c == '.';
  });
}

bool parse_bool(std::string_view s, bool* out) {
  for (std::string_view t : {"1", "on", "yes", "true"})
    if (iequal(s, t)) return *out = true, true;
  for (std::string_view t : {"0", "off", "no", "false"})
    if (iequal(s, t)) return *out = false, true;
  return false;
}

bool parse_decimal(std::string_view s, uint64_t* v) {
  if (s.empty() || s[0] < '0' || s[0] > '9') return false;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, 10);
  return ec == std::errc() && p == s.data() + s.size();
}

// Decimal, or hex after 0x/0X. A leading 0 alone never means octal.
bool parse_seed(std::string_view s, uint64_t* v) {
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    std::string_view h = s.substr(2);
    auto [p, ec] = std::from_chars(h.data(), h.data() + h.size(), *v, 16);
    return ec == std::errc() && p == h.data() + h.size();
  }
  return parse_decimal(s, v);
}

// Index of the choice (aliases separated by '/') that text names, or -1.
int parse_choice(std::string_view choices, std::string_view text) {
  int idx = 0;
  while (true) {
    size_t comma = choices.find(',');
    std::string_view group = choices.substr(0, comma);
    while (true) {
      size_t slash = group.find('/');
      if (iequal(group.substr(0, slash), text)) return idx;
      if (slash == std::string_view::npos) break;
      group.remove_prefix(slash + 1);
    }
    if (comma == std::string_view::npos) return -1;
    choices.remove_prefix(comma + 1);
    ++idx;
  }
}

std::string bad(const VarDecl& d, std::string_view text) {
  return "invalid " + std::string(d.name) + "='" + std::string(text) + "': expected " +
         plain(d.values);
}

std::atomic<bool> g_warned{false};

}  // namespace

std::span<const VarDecl> config_vars() { return kVars; }

const VarDecl* find_var(std::string_view name) {
  for (const VarDecl& d : kVars)
    if (d.name == name) return &d;
  return nullptr;
}

EnvLookup process_env() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

std::string parse_value(const VarDecl& d, std::string_view text, VarValue* out) {
  *out = VarValue{};
  if (text.empty()) return bad(d, text);  // callers treat empty as unset unless empty_is_error
  switch (d.type) {
    case VarType::kName:
      if (!valid_name(text)) return bad(d, text);
      out->s = text;
      return "";
    case VarType::kString:
    case VarType::kPath:
      out->s = text;
      return "";
    case VarType::kBool:
      return parse_bool(text, &out->b) ? "" : bad(d, text);
    case VarType::kU32: {
      uint64_t v = 0;
      bool ok = parse_decimal(text, &v) && v >= d.min && v <= d.max &&
                (!d.pow2 || (v & (v - 1)) == 0);
      if (!ok) return bad(d, text);
      out->u = v;
      return "";
    }
    case VarType::kSeed:
      return parse_seed(text, &out->u) ? "" : bad(d, text);
    case VarType::kEnum: {
      int i = parse_choice(d.choices, text);
      if (i < 0) return bad(d, text);
      out->u = static_cast<uint64_t>(i);
      return "";
    }
    case VarType::kIp: {
      std::string z(text);
      in_addr a{};
      if (inet_pton(AF_INET, z.c_str(), &a) == 1) {
        uint32_t h = ntohl(a.s_addr);
        if (h == 0 || h == 0xffffffffu || (h >> 28) == 0xe) return bad(d, text);
        out->s = z;
        return "";
      }
      // IPv6: unicast, not unspecified, not IPv4-mapped (say the IPv4 address); a zone
      // ("%eth0") only on a link-local address.
      std::string addr = z.substr(0, z.find('%'));
      in6_addr a6{};
      if (inet_pton(AF_INET6, addr.c_str(), &a6) != 1) return bad(d, text);
      const bool ll = a6.s6_addr[0] == 0xfe && (a6.s6_addr[1] & 0xc0) == 0x80;
      if (IN6_IS_ADDR_UNSPECIFIED(&a6) || IN6_IS_ADDR_MULTICAST(&a6) || IN6_IS_ADDR_V4MAPPED(&a6) ||
          (ll != (addr.size() != z.size())) || (ll && z.size() == addr.size() + 1))
        return bad(d, text);
      out->s = z;
      return "";
    }
    case VarType::kLevel:
      return parse_log_level(lowered(text), &out->level) ? "" : bad(d, text);
  }
  return bad(d, text);
}

std::string parse_config(const EnvLookup& env, Config* cfg,
                         std::span<const std::string_view> only) {
  bool strict_src_set = false;
  for (const VarDecl& d : kVars) {
    if (!only.empty() && std::find(only.begin(), only.end(), d.name) == only.end()) continue;
    std::string zname(d.name);
    const char* v = env(zname.c_str());
    if (v == nullptr) continue;
    if (d.name == "SOFTRNIC_STRICT_SRC") strict_src_set = true;
    if (*v == '\0' && !d.empty_is_error) continue;  // empty = unset
    VarValue val;
    if (std::string e = parse_value(d, v, &val); !e.empty()) return e;
    if (d.store != nullptr) d.store(cfg, val);
  }
  // SOFTRNIC_STRICT_SRC_PORT implies the strict check and contradicts SOFTRNIC_STRICT_SRC=0
  // (an empty SOFTRNIC_STRICT_SRC counts as 0 here, as it always has).
  if (cfg->strict_src_port != 0) {
    if (strict_src_set && !cfg->strict_src.value_or(false))
      return "invalid SOFTRNIC_STRICT_SRC_PORT=" + std::to_string(cfg->strict_src_port) +
             ": SOFTRNIC_STRICT_SRC=0 contradicts it (leave SOFTRNIC_STRICT_SRC unset or 1)";
    cfg->strict_src = true;
  }
  return "";
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string_view closest_var(std::string_view name) {
  std::string up(name);
  for (char& c : up) c = upper(c);
  std::string_view best;
  size_t best_d = SIZE_MAX;
  for (const VarDecl& d : kVars) {
    size_t dist = edit_distance(up, d.name);
    if (dist < best_d) best_d = dist, best = d.name;  // ties: the earlier declaration
  }
  return best;
}

std::vector<std::string> unknown_variable_messages(std::span<const std::string> names) {
  std::vector<std::string> out;
  for (const std::string& n : names) {
    if (n.size() < kPrefix.size() || !iequal(std::string_view(n).substr(0, kPrefix.size()), kPrefix))
      continue;
    if (find_var(n) != nullptr) continue;
    out.push_back("unknown variable " + n + " (did you mean " + std::string(closest_var(n)) + "?)");
  }
  return out;
}

std::vector<std::string> environment_names() {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    out.emplace_back(*e, eq ? static_cast<size_t>(eq - *e) : std::strlen(*e));
  }
  return out;
}

size_t warn_unknown_variables(LogLevel level) {
  if (level == LogLevel::kOff) return 0;
  std::vector<std::string> names = environment_names();
  std::vector<std::string> msgs = unknown_variable_messages(names);
  for (const std::string& m : msgs) log_write(LogLevel::kWarn, "%s", m.c_str());
  return msgs.size();
}

void warn_unknown_variables_once(LogLevel level) {
  if (g_warned.exchange(true)) return;
  warn_unknown_variables(level);
}

std::string config_table_text() {
  std::string o = "Environment (read when a program lists or opens the device; names are exact upper "
                  "case, keyword values any case):\n";
  for (const VarDecl& d : kVars) {
    o += "  " + std::string(d.name) + "  [" + std::string(d.reader) + "] " + plain(d.help) + "\n";
    o += "      values: " + plain(d.values) + "; default: " + plain(d.default_text) + "\n";
  }
  return o;
}

std::string config_table_markdown() {
  std::string o = "| variable | default | values | meaning | read by |\n"
                  "| --- | --- | --- | --- | --- |\n";
  for (const VarDecl& d : kVars) {
    o += "| `" + std::string(d.name) + "` | " + std::string(d.default_text) + " | " +
         std::string(d.values) + " | " + std::string(d.help) + " | " + std::string(d.reader) +
         " |\n";
  }
  return o;
}

}  // namespace rnic::base

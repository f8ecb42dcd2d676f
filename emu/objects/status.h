// emu/objects/status.h: code-only error values for emu's control paths. Errc values ARE errno
// numbers, so the shim returns `st.errno_value()` unchanged. No heap, no exceptions.
// Result<T> uses std::expected's member names so a later move to C++23 is a rename.
#pragma once

#include <cerrno>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>

namespace rnic::emu {

// errno-valued error codes (Linux numbering, from <cerrno>).
enum class Errc : uint8_t {
  kOk = 0,
  kPerm = EPERM,
  kNoEnt = ENOENT,
  kIntr = EINTR,
  kIo = EIO,
  kBadF = EBADF,
  kAgain = EAGAIN,
  kNoMem = ENOMEM,
  kAccess = EACCES,
  kFault = EFAULT,
  kBusy = EBUSY,
  kExist = EEXIST,
  kNoDev = ENODEV,
  kInval = EINVAL,
  kMFile = EMFILE,
  kNoSpc = ENOSPC,
  kRange = ERANGE,
  kNoSys = ENOSYS,
  kOverflow = EOVERFLOW,
  kOpNotSupp = EOPNOTSUPP,
  kAddrInUse = EADDRINUSE,
  kAddrNotAvail = EADDRNOTAVAIL,
  kTimedOut = ETIMEDOUT,
};

const char* errc_name(Errc e);

// A success-or-errno value. Cheap to copy; the default is success.
class [[nodiscard]] Status {
 public:
  constexpr Status() = default;
  constexpr Status(Errc e) : code_(e) {}  // NOLINT: implicit on purpose (return Errc::kInval;)
  static constexpr Status ok() { return Status(); }

  constexpr bool is_ok() const { return code_ == Errc::kOk; }
  constexpr explicit operator bool() const { return is_ok(); }
  constexpr Errc code() const { return code_; }
  // 0 on success, else the positive errno.
  constexpr int errno_value() const { return static_cast<int>(code_); }
  constexpr bool operator==(const Status&) const = default;
  constexpr bool operator==(Errc e) const { return code_ == e; }

 private:
  Errc code_ = Errc::kOk;
};

// A value or an Errc (never kOk). Mirrors std::expected<T, Errc>'s names.
template <class T>
class [[nodiscard]] Result {
 public:
  using value_type = T;
  Result(const T& v) : has_(true) { new (&storage_) T(v); }             // NOLINT
  Result(T&& v) : has_(true) { new (&storage_) T(std::move(v)); }       // NOLINT
  Result(Errc e) : has_(false), err_(e) {}                              // NOLINT
  Result(Status s) : has_(false), err_(s.code()) {}                     // NOLINT
  Result(const Result& o) : has_(o.has_), err_(o.err_) {
    if (has_) new (&storage_) T(*o.ptr());
  }
  Result(Result&& o) noexcept : has_(o.has_), err_(o.err_) {
    if (has_) new (&storage_) T(std::move(*o.ptr()));
  }
  Result& operator=(Result o) noexcept {
    reset();
    has_ = o.has_;
    err_ = o.err_;
    if (has_) new (&storage_) T(std::move(*o.ptr()));
    return *this;
  }
  ~Result() { reset(); }

  bool has_value() const { return has_; }
  explicit operator bool() const { return has_; }
  // REQUIRES: has_value().
  T& value() & { return *ptr(); }
  const T& value() const& { return *ptr(); }
  T&& value() && { return std::move(*ptr()); }
  T& operator*() & { return *ptr(); }
  const T& operator*() const& { return *ptr(); }
  T* operator->() { return ptr(); }
  const T* operator->() const { return ptr(); }
  // REQUIRES: !has_value().
  Errc error() const { return err_; }
  Status status() const { return has_ ? Status() : Status(err_); }
  T value_or(T dflt) const { return has_ ? *ptr() : dflt; }

 private:
  T* ptr() { return std::launder(reinterpret_cast<T*>(&storage_)); }
  const T* ptr() const { return std::launder(reinterpret_cast<const T*>(&storage_)); }
  void reset() {
    if (has_) ptr()->~T();
    has_ = false;
  }
  alignas(T) unsigned char storage_[sizeof(T)];
  bool has_;
  Errc err_ = Errc::kOk;
};

}  // namespace rnic::emu

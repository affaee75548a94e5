#pragma once
// Strong unit types for the cost model: Bytes, Seconds, Flops, FlopsPerSecond, BytesPerSecond.
// Values are stored in SI base units (bytes, seconds, floating-point operations). Decimal and
// binary prefixes are distinct named constructors (Bytes::gb is 1e9, Bytes::gib is 2^30), so a
// GB/GiB mix-up is visible at the call site. Quantities of different kinds do not mix without
// an explicit division (Bytes / BytesPerSecond -> Seconds).

namespace trainplan::costmodel {

template <typename Tag>
class Quantity {
 public:
  constexpr Quantity() = default;
  constexpr explicit Quantity(double value) : value_(value) {}
  [[nodiscard]] constexpr double value() const { return value_; }

  constexpr Quantity& operator+=(Quantity other) { value_ += other.value_; return *this; }
  constexpr Quantity& operator-=(Quantity other) { value_ -= other.value_; return *this; }
  friend constexpr Quantity operator+(Quantity a, Quantity b) { return Quantity(a.value_ + b.value_); }
  friend constexpr Quantity operator-(Quantity a, Quantity b) { return Quantity(a.value_ - b.value_); }
  friend constexpr Quantity operator*(Quantity a, double k) { return Quantity(a.value_ * k); }
  friend constexpr Quantity operator*(double k, Quantity a) { return Quantity(a.value_ * k); }
  friend constexpr Quantity operator/(Quantity a, double k) { return Quantity(a.value_ / k); }
  friend constexpr double operator/(Quantity a, Quantity b) { return a.value_ / b.value_; }
  friend constexpr bool operator<(Quantity a, Quantity b) { return a.value_ < b.value_; }
  friend constexpr bool operator>(Quantity a, Quantity b) { return a.value_ > b.value_; }
  friend constexpr bool operator<=(Quantity a, Quantity b) { return a.value_ <= b.value_; }
  friend constexpr bool operator>=(Quantity a, Quantity b) { return a.value_ >= b.value_; }
  friend constexpr bool operator==(Quantity a, Quantity b) { return a.value_ == b.value_; }

 private:
  double value_ = 0.0;
};

struct BytesTag {};
struct SecondsTag {};
struct FlopsTag {};
struct FlopsPerSecondTag {};
struct BytesPerSecondTag {};

class Bytes : public Quantity<BytesTag> {
 public:
  using Quantity::Quantity;
  constexpr Bytes(Quantity<BytesTag> q) : Quantity(q.value()) {}  // NOLINT: implicit from base
  static constexpr Bytes gb(double x) { return Bytes(x * 1e9); }
  static constexpr Bytes gib(double x) { return Bytes(x * 1073741824.0); }
  static constexpr Bytes mib(double x) { return Bytes(x * 1048576.0); }
  [[nodiscard]] constexpr double in_gb() const { return value() / 1e9; }
  [[nodiscard]] constexpr double in_gib() const { return value() / 1073741824.0; }
};

class Seconds : public Quantity<SecondsTag> {
 public:
  using Quantity::Quantity;
  constexpr Seconds(Quantity<SecondsTag> q) : Quantity(q.value()) {}  // NOLINT
  static constexpr Seconds us(double x) { return Seconds(x * 1e-6); }
  static constexpr Seconds ms(double x) { return Seconds(x * 1e-3); }
  static constexpr Seconds hours(double x) { return Seconds(x * 3600.0); }
  [[nodiscard]] constexpr double in_hours() const { return value() / 3600.0; }
  [[nodiscard]] constexpr double in_days() const { return value() / 86400.0; }
};

class Flops : public Quantity<FlopsTag> {
 public:
  using Quantity::Quantity;
  constexpr Flops(Quantity<FlopsTag> q) : Quantity(q.value()) {}  // NOLINT
};

class FlopsPerSecond : public Quantity<FlopsPerSecondTag> {
 public:
  using Quantity::Quantity;
  constexpr FlopsPerSecond(Quantity<FlopsPerSecondTag> q) : Quantity(q.value()) {}  // NOLINT
  static constexpr FlopsPerSecond tflops(double x) { return FlopsPerSecond(x * 1e12); }
  [[nodiscard]] constexpr double in_tflops() const { return value() / 1e12; }
};

class BytesPerSecond : public Quantity<BytesPerSecondTag> {
 public:
  using Quantity::Quantity;
  constexpr BytesPerSecond(Quantity<BytesPerSecondTag> q) : Quantity(q.value()) {}  // NOLINT
  static constexpr BytesPerSecond gb_per_s(double x) { return BytesPerSecond(x * 1e9); }
  static constexpr BytesPerSecond tb_per_s(double x) { return BytesPerSecond(x * 1e12); }
  // Network line rates are quoted in gigabits per second (1 Gb/s = 1e9 bits/s = 1.25e8 B/s).
  static constexpr BytesPerSecond gbit_per_s(double x) { return BytesPerSecond(x * 1e9 / 8.0); }
  [[nodiscard]] constexpr double in_gb_per_s() const { return value() / 1e9; }
};

constexpr Seconds operator/(Bytes b, BytesPerSecond r) { return Seconds(b.value() / r.value()); }
constexpr Seconds operator/(Flops f, FlopsPerSecond r) { return Seconds(f.value() / r.value()); }
constexpr FlopsPerSecond operator/(Flops f, Seconds s) { return FlopsPerSecond(f.value() / s.value()); }

}  // namespace trainplan::costmodel

// The vector loops of the x86 kernels, written once for every instruction set:
// avx2.cc and avx512.cc each include this file inside their anonymous namespace, after
// defining
//   CHORUS_REDUCE_TARGET  the target attribute of their functions;
//   element adapters      F32, F64, F16, BF16 and Int<T, Domain> (Type::Elem, kLanes,
//                         load, store, kNanFrom for the floating ones), deriving from
//                         the domains Ps and Pd (floating) or integer ones;
//   operators             Sum, Prod, Min, Max (Op::apply(domain, a, b), kArithmetic);
//   keep_nan              for the Ps and Pd vectors;
//   Div, splat            a quotient, and a value in every lane, for Ps and Pd.
// It defines the pairwise kernel reduce(), the many-source reduce_many(), finish_avg's
// divide() and the kernel table `Isa` for select_kernel and select_divide (kernels.h).
// Everything here then has that file's target and internal linkage. No include guard:
// it is meant to be included once per instruction set.

template <class Type>
constexpr bool kFloating = std::is_base_of_v<Ps, Type> || std::is_base_of_v<Pd, Type>;

// One vector of results. Both inputs are loaded before the store, so `o` may alias
// `x` or `y` exactly.
template <class Type, class Op, class V>
CHORUS_REDUCE_TARGET V combine(V u, V v) {
  V r = Op::apply(Type{}, u, v);
  if constexpr (Op::kArithmetic && kFloating<Type>) {
    r = keep_nan(Type::kNanFrom == NanFrom::kA ? u : v, r);
  }
  return r;
}

template <class Type, class Op>
CHORUS_REDUCE_TARGET void step(typename Type::Elem* o, const typename Type::Elem* x,
                               const typename Type::Elem* y) {
  Type::store(o, combine<Type, Op>(Type::load(x), Type::load(y)));
}

// The last n < kLanes elements, through the same vector code on zero-padded copies, so
// that they are computed exactly like the others.
template <class Type, class Op>
CHORUS_REDUCE_TARGET void step_partial(typename Type::Elem* o, const typename Type::Elem* x,
                                       const typename Type::Elem* y, size_t n) {
  using Elem = typename Type::Elem;
  Elem xs[Type::kLanes] = {}, ys[Type::kLanes] = {}, os[Type::kLanes];
  std::memcpy(xs, x, n * sizeof(Elem));
  std::memcpy(ys, y, n * sizeof(Elem));
  step<Type, Op>(os, xs, ys);
  std::memcpy(o, os, n * sizeof(Elem));
}

template <class Type, class Op>
CHORUS_REDUCE_TARGET void reduce(void* out, const void* a, const void* b, size_t n) {
  using Elem = typename Type::Elem;
  Elem* o = static_cast<Elem*>(out);
  const Elem* x = static_cast<const Elem*>(a);
  const Elem* y = static_cast<const Elem*>(b);
  size_t i = 0;
  for (; i + Type::kLanes <= n; i += Type::kLanes) step<Type, Op>(o + i, x + i, y + i);
  if (i < n) step_partial<Type, Op>(o + i, x + i, y + i, n - i);
}

// A result as reduce() stores it and the next step loads it back: f16 and bf16 round
// to their 16 bits; the other types hold every value exactly.
template <class Type, class V>
CHORUS_REDUCE_TARGET V rounded(V v) {
  if constexpr (kFloating<Type> && sizeof(typename Type::Elem) == 2) {
    typename Type::Elem tmp[Type::kLanes];
    Type::store(tmp, v);
    return Type::load(tmp);
  } else {
    return v;
  }
}

// The many-source kernel (reduce.h): blocks of kManyBlock vectors, each combined from
// all sources in registers, in the order and with the roundings of reduce() called
// over the sources one after another; a block is stored once all sources are read.
constexpr size_t kManyBlock = 4;

template <class Type, class Op, size_t kBlock>
CHORUS_REDUCE_TARGET void reduce_many_block(typename Type::Elem* o, const void* const* src, int k, size_t i) {
  using Elem = typename Type::Elem;
  using V = decltype(Type::load(static_cast<const Elem*>(nullptr)));
  const Elem* x = source_at<Elem>(src, 0, i);
  const Elem* y = source_at<Elem>(src, 1, i);
  V r[kBlock];
  for (size_t b = 0; b < kBlock; ++b) {
    r[b] = combine<Type, Op>(Type::load(x + b * Type::kLanes), Type::load(y + b * Type::kLanes));
  }
  for (int j = 2; j < k; ++j) {
    const Elem* z = source_at<Elem>(src, j, i);
    for (size_t b = 0; b < kBlock; ++b) {
      r[b] = combine<Type, Op>(rounded<Type>(r[b]), Type::load(z + b * Type::kLanes));
    }
  }
  for (size_t b = 0; b < kBlock; ++b) Type::store(o + i + b * Type::kLanes, r[b]);
}

template <class Type, class Op>
CHORUS_REDUCE_TARGET void reduce_many(void* out, const void* const* src, int k, size_t n) {
  using Elem = typename Type::Elem;
  Elem* o = static_cast<Elem*>(out);
  size_t i = 0;
  for (; i + kManyBlock * Type::kLanes <= n; i += kManyBlock * Type::kLanes) {
    reduce_many_block<Type, Op, kManyBlock>(o, src, k, i);
  }
  for (; i + Type::kLanes <= n; i += Type::kLanes) reduce_many_block<Type, Op, 1>(o, src, k, i);
  if (i == n) return;
  step_partial<Type, Op>(o + i, source_at<Elem>(src, 0, i), source_at<Elem>(src, 1, i), n - i);
  for (int j = 2; j < k; ++j) step_partial<Type, Op>(o + i, o + i, source_at<Elem>(src, j, i), n - i);
}

// buf[i] op= s, vector by vector; the last n < kLanes elements through the same vector
// code on a zero-padded copy.
template <class Type, class Op, class V>
CHORUS_REDUCE_TARGET void scale(typename Type::Elem* p, size_t n, V s) {
  using Elem = typename Type::Elem;
  size_t i = 0;
  for (; i + Type::kLanes <= n; i += Type::kLanes) {
    Type::store(p + i, Op::apply(Type{}, Type::load(p + i), s));
  }
  if (i == n) return;
  Elem tmp[Type::kLanes] = {};
  std::memcpy(tmp, p + i, (n - i) * sizeof(Elem));
  Type::store(tmp, Op::apply(Type{}, Type::load(tmp), s));
  std::memcpy(p + i, tmp, (n - i) * sizeof(Elem));
}

// scalar_divide (kernels.h) on vectors, for the floating types: the divisor and its
// reciprocal are converted to the lanes' type as the scalar code converts them (int to
// double is exact, and double to float rounds as int to float does). A lane holding a
// NaN keeps it, quieted, as the scalar operations do: the divisor is never one.
template <class Type>
CHORUS_REDUCE_TARGET void divide(void* buf, size_t n, int d) {
  auto* p = static_cast<typename Type::Elem*>(buf);
  if (divide_by_reciprocal(d)) {
    scale<Type, Prod>(p, n, splat(Type{}, 1.0 / d));
  } else {
    scale<Type, Div>(p, n, splat(Type{}, static_cast<double>(d)));
  }
}

// The kernel table select_kernel (kernels.h) reads.
struct Isa {
  using F32 = reduce::F32;
  using F64 = reduce::F64;
  using F16 = reduce::F16;
  using BF16 = reduce::BF16;
  using I8 = Int<int8_t, Epi8>;
  using U8 = Int<uint8_t, Epu8>;
  using I32 = Int<int32_t, Epi32>;
  using I64 = Int<int64_t, Epi64>;
  using Sum = reduce::Sum;
  using Prod = reduce::Prod;
  using Min = reduce::Min;
  using Max = reduce::Max;
  template <class Type, class Op>
  static ReduceFn kernel() {
    return reduce<Type, Op>;
  }
  template <class Type, class Op>
  static ReduceManyFn many() {
    return reduce_many<Type, Op>;
  }
  // Integers: none (the portable kernels divide them).
  template <class Type>
  static DivideFn divide() {
    if constexpr (kFloating<Type>) {
      return reduce::divide<Type>;
    } else {
      return nullptr;
    }
  }
};

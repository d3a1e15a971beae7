// The many-source loops of the x86 kernels (reduce.h, ReduceManyFn), written once for
// reduce_avx2.cc and reduce_avx512.cc: each includes this file inside its anonymous
// namespace, after defining CHORUS_REDUCE_TARGET (its target attribute), its element
// adapters (Type::load/store/kLanes), kFloating, combine() (one vector step on loaded
// vectors) and step_partial(). Everything here then has that file's target and internal
// linkage. No include guard: it is meant to be included once per instruction set.

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

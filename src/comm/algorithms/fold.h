// Non-power-of-two support for the recursive algorithms: the first 2*rem ranks
// (rem = size - largest power of two) pair up; each even one hands its data to the odd
// one above it and sits out, so that a power of two of ranks remains. Afterwards the
// odd ranks hand the result back.
#pragma once

namespace chorus::algorithms {

struct Fold {
  int pow2 = 1;   // ranks taking part after the fold
  int rem = 0;    // size - pow2
  int vrank = -1; // rank among the pow2 ranks, -1 for a rank that sits out

  Fold(int size, int rank) {
    while (pow2 * 2 <= size) pow2 *= 2;
    rem = size - pow2;
    if (rank < 2 * rem) vrank = rank % 2 == 1 ? rank / 2 : -1;
    else vrank = rank - rem;
  }
  // The real rank of virtual rank v.
  int real(int v) const { return v < rem ? 2 * v + 1 : v + rem; }
  bool folded(int rank) const { return rank < 2 * rem; }
};

}  // namespace chorus::algorithms

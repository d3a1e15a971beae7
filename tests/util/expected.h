// The tests' name for the closed-form element patterns, which chorus-bench shares
// (library chorus_patterns, src/patterns/expected.h, namespace chorus::patterns). The
// tests call them as test::fill_move() and the like, beside their other helpers.
#pragma once

#include "patterns/expected.h"

namespace chorus::test {
using namespace chorus::patterns;
}  // namespace chorus::test

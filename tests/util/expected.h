// The tests' name for the closed-form element patterns, which chorus-bench shares
// (library chorus_patterns, src/patterns/expected.h).
#pragma once

#include "patterns/expected.h"

// The one reduction the CPU communicators share, so that the thread and TCP groups give the same
// bits: element-wise sum of one buffer per rank, added in rank order in f32 and rounded once to the
// buffer's type (F32 or BF16). `dst` may be one of the sources only when every source is read
// before it is written, which holds element by element here.
#pragma once

#include <cstddef>
#include <span>

#include "core/dtype.h"

namespace kiln::dist {

void sum_in_rank_order(std::span<const void* const> sources, size_t count, DType dtype, void* dst);

}  // namespace kiln::dist

// The slice of each checkpoint tensor a rank holds under a ParallelLayout, so that a rank reads
// only its rows or columns from the safetensors files (no full copy per rank) and the planner can
// count a rank's bytes exactly. Column-parallel projections (q/kv up-projections, gate/up) split
// their output rows; row-parallel ones (o_proj, down) split their input columns; norms, the LoRA
// down-projections and the router are whole on every rank.
#pragma once

#include <string>

#include "dist/parallel_layout.h"
#include "model/weight_layout.h"

namespace kiln::dist {

struct WeightShard {
  bool held = true;  // false: another rank holds this tensor (a routed expert of another EP group)
  int dim = -1;      // -1: the whole tensor; 0: a range of rows; 1: a range of columns
  Range range;       // along `dim`

  bool operator==(const WeightShard&) const = default;
};

WeightShard weight_shard(const WeightSpec& w, const ModelConfig& m, const ParallelLayout& layout, int rank);

// Elements of `w` this shard holds.
int64_t shard_numel(const WeightSpec& w, const WeightShard& s);

// The rows (or columns) of a block-quantised scale tensor (one scale per `block` rows or columns
// of the weight) that a weight range needs: a range that does not start or end on a block edge
// shares its edge blocks' scales with the neighbouring rank.
Range scale_range(Range weight_range, int64_t block);

}  // namespace kiln::dist

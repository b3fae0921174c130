// CPU reference ops: plain loops with f32 accumulation (OpenBLAS for the GEMMs, OpenMP across
// rows). Obviously correct first; every fast path is tested against these.
#pragma once

#include "core/tensor.h"
#include "ops/params.h"

namespace kiln::ops::cpu {

void copy(const CopyParams& p);
// Counter-hash uniform(-scale, scale), the same values the CUDA backend produces.
void fill_random(const Tensor& t, uint64_t seed, float scale);
void embedding(const EmbeddingParams& p);
void rms_norm(const RmsNormParams& p);
void linear(const LinearParams& p);
void linear_heads(const LinearHeadsParams& p);
void add(const AddParams& p);
void take_tokens(const TakeTokensParams& p);
void swiglu(const SwigluParams& p);
void rope(const RopeParams& p);
void mla_expanded(const MlaExpandedParams& p);
void mla_absorbed(const MlaAbsorbedParams& p);
void kv_scatter(const KvScatterParams& p);
void kv_gather(const KvGatherParams& p);
// Composes (linear_heads,) copy, rope, rms_norm and kv_scatter: bit for bit the sequence it replaces.
void mla_prepare(const MlaPrepareParams& p);
void router(const RouterParams& p);
void moe(const MoeParams& p);
void log_softmax(const LogSoftmaxParams& p);

}  // namespace kiln::ops::cpu

#include "engine/device_sampling.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace kiln {

DeviceSamples start_sampling(ops::Backend& be, const Tensor& logits, const std::vector<const Sequence*>& seqs) {
  const auto R = static_cast<int64_t>(seqs.size());
  const int64_t V = logits.shape.at(1);
  KILN_CHECK(logits.shape.at(0) == R, "internal: {} logit rows for {} sequences", logits.shape.at(0), R);
  DeviceSamples d;
  d.rows = R;
  if (R == 0) return d;
  for (const Sequence* s : seqs) {
    const SamplingParams& p = s->sampler.params();
    // Rows wanting more than the op gives are the host path's (their results here are unused).
    if (p.logprobs || p.top_logprobs > 0)
      d.num_top = std::max(d.num_top, std::min(p.top_logprobs, ops::kMaxTopLogprobs));
    d.wanted_top.push_back(p.logprobs || p.top_logprobs > 0 ? p.top_logprobs : -1);
  }
  const int64_t num_top = d.num_top;
  // Penalty entries (none for a request whose penalties are off); no CSR at all when no row has any.
  std::vector<int32_t> pen_off{0}, pen_ids, pen_counts;
  for (const Sequence* s : seqs) {
    const PenaltyTokens t = penalty_tokens(s->sampler.params(), s->prompt(), s->output());
    pen_ids.insert(pen_ids.end(), t.ids.begin(), t.ids.end());
    pen_counts.insert(pen_counts.end(), t.counts.begin(), t.counts.end());
    pen_off.push_back(static_cast<int32_t>(pen_ids.size()));
  }
  const bool any_penalty = !pen_ids.empty();

  // One upload: [seed u64 | counter u64 | temperature top_p min_p rep pres freq f32 | top_k i32 |
  // pen_off pen_ids pen_counts i32], in 4-byte words with the u64 arrays first (aligned).
  const int64_t n_pen = static_cast<int64_t>(pen_ids.size());
  const int64_t words = 4 * R + 7 * R + (any_penalty ? (R + 1) + 2 * n_pen : 0);
  std::vector<uint32_t> host(static_cast<size_t>(words));
  auto* seed = reinterpret_cast<uint64_t*>(host.data());
  uint64_t* counter = seed + R;
  auto* f = reinterpret_cast<float*>(host.data() + 4 * R);
  float *temperature = f, *top_p = f + R, *min_p = f + 2 * R, *rep = f + 3 * R, *pres = f + 4 * R, *freq = f + 5 * R;
  auto* top_k = reinterpret_cast<int32_t*>(host.data() + 10 * R);
  for (int64_t i = 0; i < R; ++i) {
    const Sequence& s = *seqs[static_cast<size_t>(i)];
    const SamplingParams& p = s.sampler.params();
    seed[i] = s.sampler.seed();
    counter[i] = static_cast<uint64_t>(s.num_output());
    temperature[i] = p.temperature;
    top_p[i] = p.top_p;
    min_p[i] = p.min_p;
    rep[i] = p.repetition_penalty;
    pres[i] = p.presence_penalty;
    freq[i] = p.frequency_penalty;
    top_k[i] = static_cast<int32_t>(std::clamp<int64_t>(p.top_k, -1, INT32_MAX));
  }
  if (any_penalty) {
    int32_t* pen = reinterpret_cast<int32_t*>(host.data() + 11 * R);
    // std::copy, not memcpy: the id lists may be empty (penalties on, nothing generated yet).
    std::copy(pen_off.begin(), pen_off.end(), pen);
    std::copy(pen_ids.begin(), pen_ids.end(), pen + R + 1);
    std::copy(pen_counts.begin(), pen_counts.end(), pen + R + 1 + n_pen);
  }
  ops::OwnedTensor in = be.alloc(DType::I32, {words});
  be.upload(in.t, host.data());
  const auto* din = static_cast<const uint32_t*>(in.t.data);

  // Outputs in one buffer too: [token i32 | logprob f32 | top ids i32 | top logprobs f32].
  ops::OwnedTensor outb = be.alloc(DType::I32, {2 * R + 2 * R * num_top});
  auto* dout = static_cast<uint32_t*>(outb.t.data);
  ops::SampleParams sp{};
  sp.logits = logits.f32();
  sp.logits_stride = V;
  sp.rows = R;
  sp.vocab = V;
  const auto* df = reinterpret_cast<const float*>(din + 4 * R);
  sp.temperature = df;
  sp.top_p = df + R;
  sp.min_p = df + 2 * R;
  sp.repetition = df + 3 * R;
  sp.presence = df + 4 * R;
  sp.frequency = df + 5 * R;
  sp.top_k = reinterpret_cast<const int32_t*>(din + 10 * R);
  sp.seed = reinterpret_cast<const uint64_t*>(din);
  sp.counter = reinterpret_cast<const uint64_t*>(din) + R;
  if (any_penalty) {
    const auto* pen = reinterpret_cast<const int32_t*>(din + 11 * R);
    sp.pen_offsets = pen;
    sp.pen_ids = pen + R + 1;
    sp.pen_counts = pen + R + 1 + n_pen;
  }
  sp.num_top = num_top;
  sp.token = reinterpret_cast<int32_t*>(dout);
  sp.logprob = reinterpret_cast<float*>(dout + R);
  sp.top_ids = reinterpret_cast<int32_t*>(dout + 2 * R);
  sp.top_logprobs = reinterpret_cast<float*>(dout + 2 * R + R * num_top);
  be.sample(sp);
  d.out = std::move(outb);
  d.download = be.start_download(d.out.t);
  return d;
}

std::vector<SampleResult> finish_sampling(ops::Backend& be, const DeviceSamples& d) {
  const int64_t R = d.rows, num_top = d.num_top;
  std::vector<SampleResult> results(static_cast<size_t>(R));
  if (R == 0) return results;
  std::vector<uint32_t> back(static_cast<size_t>(2 * R + 2 * R * num_top));
  be.finish_download(d.download, back.data());
  for (int64_t i = 0; i < R; ++i) {
    SampleResult& r = results[static_cast<size_t>(i)];
    std::memcpy(&r.token, &back[static_cast<size_t>(i)], 4);
    const int64_t wanted = d.wanted_top[static_cast<size_t>(i)];
    if (wanted < 0) continue;
    std::memcpy(&r.logprob, &back[static_cast<size_t>(R + i)], 4);
    for (int64_t j = 0; j < std::min(wanted, num_top); ++j) {
      TokenLogprob t;
      std::memcpy(&t.token, &back[static_cast<size_t>(2 * R + i * num_top + j)], 4);
      std::memcpy(&t.logprob, &back[static_cast<size_t>(2 * R + R * num_top + i * num_top + j)], 4);
      r.top.push_back(t);
    }
  }
  return results;
}

std::vector<SampleResult> sample_on_backend(ops::Backend& be, const Tensor& logits,
                                            const std::vector<const Sequence*>& seqs) {
  return finish_sampling(be, start_sampling(be, logits, seqs));
}

}  // namespace kiln

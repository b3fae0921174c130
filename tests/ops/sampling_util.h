// Helpers for the sample op's tests: a batch on the host, run on any backend with poisoned
// outputs, and a brute-force reference of the cuts (full sort, f64).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "parity_util.h"

namespace kiln::test {

struct SampleBatch {
  int64_t rows = 0, vocab = 0, num_top = 0;
  std::vector<float> logits;                                                      // [rows, vocab]
  std::vector<float> temperature, top_p, min_p, repetition, presence, frequency;  // [rows]
  std::vector<int32_t> top_k;                                                     // [rows]
  std::vector<uint64_t> seed, counter;                                            // [rows]
  std::vector<int32_t> pen_offsets;                                               // [rows + 1], or empty: no penalties
  std::vector<int32_t> pen_ids, pen_counts;

  // Row r gets the given mode; logits are set by the caller.
  void resize(int64_t r, int64_t v, int64_t top) {
    rows = r, vocab = v, num_top = top;
    const auto n = static_cast<size_t>(r);
    logits.assign(n * static_cast<size_t>(v), 0.0f);
    temperature.assign(n, 1.0f), top_p.assign(n, 1.0f), min_p.assign(n, 0.0f);
    repetition.assign(n, 1.0f), presence.assign(n, 0.0f), frequency.assign(n, 0.0f);
    top_k.assign(n, 0), seed.assign(n, 0), counter.assign(n, 0);
  }
  float* row(int64_t r) { return logits.data() + r * vocab; }
};

struct SampleOut {
  std::vector<int32_t> token, top_ids;  // [rows], [rows, num_top]
  std::vector<float> logprob, top_lp;   // [rows], [rows, num_top]
  std::vector<float> logits_after;      // [rows, vocab]: must equal the input
};

inline SampleOut run_sample(ops::Backend& be, const SampleBatch& b) {
  const auto rows = static_cast<size_t>(b.rows), ntop = static_cast<size_t>(b.rows * b.num_top);
  auto tl = put(be, b.logits);
  auto tt = put(be, b.temperature), tp = put(be, b.top_p), tm = put(be, b.min_p);
  auto trp = put(be, b.repetition), tpr = put(be, b.presence), tfr = put(be, b.frequency);
  auto tk = put_raw(be, b.top_k, DType::I32);
  auto ts = put_raw(be, b.seed, DType::I64), tc = put_raw(be, b.counter, DType::I64);
  const bool pen = !b.pen_offsets.empty();
  std::vector<int32_t> none(1, 0);
  auto toff = put_raw(be, pen ? b.pen_offsets : none, DType::I32);
  auto tid = put_raw(be, pen && !b.pen_ids.empty() ? b.pen_ids : none, DType::I32);
  auto tcnt = put_raw(be, pen && !b.pen_counts.empty() ? b.pen_counts : none, DType::I32);
  // Poisoned outputs: anything the op fails to write shows up.
  auto tok = put_raw(be, std::vector<int32_t>(rows, -7), DType::I32);
  auto lp = poisoned(be, rows);
  auto tid_out = put_raw(be, std::vector<int32_t>(std::max<size_t>(ntop, 1), -7), DType::I32);
  auto tlp_out = poisoned(be, std::max<size_t>(ntop, 1));
  ops::SampleParams p{tl.f32(),
                      0,
                      b.rows,
                      b.vocab,
                      tt.f32(),
                      tk.t.as<int32_t>(),
                      tp.f32(),
                      tm.f32(),
                      trp.f32(),
                      tpr.f32(),
                      tfr.f32(),
                      ts.t.as<uint64_t>(),
                      tc.t.as<uint64_t>(),
                      pen ? toff.t.as<int32_t>() : nullptr,
                      tid.t.as<int32_t>(),
                      tcnt.t.as<int32_t>(),
                      b.num_top,
                      tok.t.as<int32_t>(),
                      lp.f32(),
                      tid_out.t.as<int32_t>(),
                      tlp_out.f32()};
  be.sample(p);
  SampleOut o;
  o.token.resize(rows);
  be.download(o.token.data(), tok.t);
  o.logprob = get(be, lp);
  std::vector<int32_t> ids(std::max<size_t>(ntop, 1));
  be.download(ids.data(), tid_out.t);
  ids.resize(ntop);
  o.top_ids = ids;
  o.top_lp = get(be, tlp_out);
  o.top_lp.resize(ntop);
  o.logits_after = get(be, tl);
  return o;
}

// The cuts by their definition: full sort by (value desc, id asc), f64 weights. Returns the kept
// ids ascending with their weights; greedy rows keep the argmax alone.
struct BruteKept {
  std::vector<int32_t> ids;
  std::vector<double> w;
};
inline BruteKept brute_kept(const float* l, int64_t n, float temp, int64_t top_k, float top_p, float min_p) {
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  if (temp <= 0) return {{order[0]}, {1.0}};
  const double mx = l[order[0]];
  auto w = [&](int32_t i) { return std::exp((static_cast<double>(l[i]) - mx) / temp); };
  size_t keep = top_k > 0 && top_k < n ? static_cast<size_t>(top_k) : order.size();
  if (top_p < 1) {
    double zk = 0, cum = 0;
    for (size_t j = 0; j < keep; ++j) zk += w(order[j]);
    for (size_t j = 0; j < keep; ++j) {
      cum += w(order[j]);
      if (cum >= top_p * zk) {
        keep = j + 1;
        break;
      }
    }
  }
  order.resize(keep);
  if (min_p > 0) std::erase_if(order, [&](int32_t i) { return w(i) < min_p; });
  std::sort(order.begin(), order.end());
  BruteKept k;
  k.ids = order;
  for (int32_t i : order) k.w.push_back(w(i));
  return k;
}

inline int32_t brute_draw(const BruteKept& k, double u) {
  double total = 0, cum = 0;
  for (double x : k.w) total += x;
  for (size_t j = 0; j < k.ids.size(); ++j)
    if ((cum += k.w[j]) > u * total) return k.ids[j];
  return k.ids.back();
}

// Random logits: N(0, scale) rows; with `quantum` > 0 rounded to multiples of it (many ties).
inline void fill_logits(SampleBatch& b, uint64_t seed, float scale, float quantum) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  for (auto& x : b.logits) {
    x = d(g);
    if (quantum > 0) x = std::round(x / quantum) * quantum;
  }
}

}  // namespace kiln::test

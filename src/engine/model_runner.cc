#include "engine/model_runner.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "engine/device_sampling.h"
#include "kv/block_allocator.h"
#include "ops/cpu/sampling.h"

namespace kiln {
namespace {

// Row p predicts token p + 1: a prompt row when that token is a prompt token not yet reported.
bool wants_prompt_row(const Sequence& s, int64_t p) {
  return s.prompt_logprobs >= 0 && p + 1 < s.num_prompt && p + 1 >= s.prompt_logprobs_done;
}

void record_prompt_logprob(Sequence& s, int64_t p, std::span<const float> logits) {
  const std::vector<float> lp = log_softmax_row(logits.data(), static_cast<int64_t>(logits.size()));
  s.pending.prompt_logprobs.push_back(lp[static_cast<size_t>(s.tokens[static_cast<size_t>(p + 1)])]);
  std::vector<TokenLogprob> top;
  for (int32_t t : ops::cpu::top_n_row(lp.data(), static_cast<int64_t>(lp.size()),
                                       std::min(s.prompt_logprobs, static_cast<int64_t>(lp.size()))))
    top.push_back({t, lp[static_cast<size_t>(t)]});
  s.pending.prompt_top.push_back(std::move(top));
  s.prompt_logprobs_done = p + 2;
}

}  // namespace

ForwardBatch ModelRunner::build(const SchedulerOutput& out, const InFlight* prev) const {
  ForwardBatch b;
  const int64_t bs = pool_.block_size;
  bool pending = false;                               // some token comes from prev's samples
  std::unordered_map<const Sequence*, int32_t> rows;  // prev's sampled sequence -> its row
  if (prev)
    for (size_t i = 0; i < prev->sampled.size(); ++i) rows.emplace(prev->sampled[i], static_cast<int32_t>(i));
  auto prev_row = [&](const Sequence* s) {
    const auto it = rows.find(s);
    KILN_CHECK(it != rows.end(), "internal: request {} has a pending token but no step in flight sampled it", s->id);
    return it->second;
  };
  bool verify = false;
  for (const ScheduledSeq& it : out.seqs) {
    b.max_blocks = std::max(b.max_blocks, kv::blocks_for(it.start + it.num_tokens + it.num_draft, bs));
    verify |= it.num_draft > 0;
  }
  b.cu_q.push_back(0);
  for (const ScheduledSeq& it : out.seqs) {
    const Sequence& s = *it.seq;
    if (verify) b.verify_rows.push_back(it.num_draft > 0);
    for (int64_t p = it.start; p < it.start + it.num_tokens; ++p) {
      const int32_t token = s.tokens[static_cast<size_t>(p)];
      pending |= token == kPendingToken;
      b.token_from.push_back(token == kPendingToken ? prev_row(&s) : -1);
      b.tokens.push_back(token == kPendingToken ? 0 : token);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slot_mapping.push_back(kv::slot_of(s.block_table, p, bs));
      if (wants_prompt_row(s, p)) b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
    }
    if (it.sample) b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
    // Speculation: the drafts follow the sampled row, each scored too.
    KILN_CHECK(it.num_draft == 0 || (it.sample && static_cast<int64_t>(s.drafts.size()) == it.num_draft),
               "internal: request {} verifies {} drafts but has {}", s.id, it.num_draft, s.drafts.size());
    for (int64_t j = 0; j < it.num_draft; ++j) {
      const int64_t p = it.start + it.num_tokens + j;
      b.tokens.push_back(s.drafts[static_cast<size_t>(j)]);
      b.token_from.push_back(-1);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slot_mapping.push_back(kv::slot_of(s.block_table, p, bs));
      b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
    }
    if (!taps_.empty() && s.spec_tokens > 0)  // a speculating row: its drafter reads every row's hidden state
      for (int32_t r = b.cu_q.back(); r < static_cast<int32_t>(b.tokens.size()); ++r) b.hidden_rows.push_back(r);
    const int64_t end = it.start + it.num_tokens + it.num_draft;
    b.cu_q.push_back(static_cast<int32_t>(b.tokens.size()));
    b.kv_lens.push_back(static_cast<int32_t>(end));
    const int64_t used = kv::blocks_for(end, bs);
    b.block_tables.insert(b.block_tables.end(), s.block_table.begin(), s.block_table.begin() + used);
    b.block_tables.insert(b.block_tables.end(), static_cast<size_t>(b.max_blocks - used), 0);
  }
  if (!b.hidden_rows.empty()) b.hidden_taps = taps_;
  if (pending)
    b.prev_tokens = prev->samples.tokens();
  else
    b.token_from.clear();
  return b;
}

ModelRunner::InFlight ModelRunner::launch(const SchedulerOutput& out, const InFlight* prev) {
  ops::Backend& be = model_.backend();
  for (const ScheduledSeq& it : out.seqs)
    KILN_CHECK(it.num_draft == 0, "internal: the overlapped loop got request {} with drafts to verify", it.seq->id);
  InFlight step;
  step.start = be.mark();
  const ForwardBatch batch = build(out, prev);
  KILN_CHECK(batch.hidden_rows.empty(), "internal: the overlapped loop got a speculating request");
  const Tensor logits = model_.forward_logits(batch, pool_, form_);  // [sampled rows, vocab] on the backend
  for (const ScheduledSeq& it : out.seqs)
    if (it.sample) step.sampled.push_back(it.seq);
  KILN_CHECK(static_cast<int64_t>(step.sampled.size()) == logits.shape.at(0),
             "internal: an overlapped step has {} logit rows for {} sampled sequences", logits.shape.at(0),
             step.sampled.size());
  step.samples = start_sampling(be, logits, step.sampled);
  step.end = be.mark();
  step.out = out;
  return step;
}

std::vector<SampleResult> ModelRunner::collect(const InFlight& step) {
  std::vector<SampleResult> results = finish_sampling(model_.backend(), step.samples);
  last_device_seconds_ = model_.backend().elapsed_seconds(step.start, step.end);
  return results;
}

std::vector<SampleResult> ModelRunner::run(const SchedulerOutput& out, std::vector<std::vector<float>>* verify,
                                           std::vector<std::vector<float>>* hidden) {
  ops::Backend& be = model_.backend();
  const auto start = be.mark();
  const ForwardBatch batch = build(out);
  const Tensor logits = model_.forward_logits(batch, pool_, form_);  // [logit rows, vocab] on the backend
  const int64_t V = model_.config().vocab_size;
  if (hidden) {  // the speculating sequences' rows, in batch order: [rows, taps, H] each
    hidden->assign(out.seqs.size(), {});
    if (!batch.hidden_rows.empty()) {
      const Tensor h = model_.hidden_states();  // [hidden rows, taps, H]
      std::vector<float> all(static_cast<size_t>(h.numel()));
      be.download(all.data(), h);
      const int64_t per_row = h.shape[1] * h.shape[2];
      size_t row = 0;
      for (size_t i = 0; i < out.seqs.size(); ++i) {
        const ScheduledSeq& it = out.seqs[i];
        if (it.seq->spec_tokens == 0) continue;
        const auto n = static_cast<size_t>((it.num_tokens + it.num_draft) * per_row);
        (*hidden)[i].assign(all.begin() + static_cast<std::ptrdiff_t>(row),
                            all.begin() + static_cast<std::ptrdiff_t>(row + n));
        row += n;
      }
    }
  }

  // Which sequence each logit row belongs to, and whether the row is its sampled one.
  std::vector<const Sequence*> row_seq;
  std::vector<char> row_sampled;
  for (const ScheduledSeq& it : out.seqs) {
    for (int64_t p = it.start; p < it.start + it.num_tokens; ++p)
      if (wants_prompt_row(*it.seq, p)) row_seq.push_back(it.seq), row_sampled.push_back(0);
    // A verify row's 1 + num_draft rows go to the verifier (row_sampled 2), not to the sampler.
    if (it.sample) row_seq.push_back(it.seq), row_sampled.push_back(it.num_draft > 0 ? 2 : 1);
    for (int64_t j = 0; j < it.num_draft; ++j) row_seq.push_back(it.seq), row_sampled.push_back(2);
  }
  const auto rows = static_cast<int64_t>(row_seq.size());
  auto host_only = [](const Sequence& s) {
    // logit_bias too: rare, and exact on the host (the device op has no bias input).
    return s.constraint != nullptr || s.sampler.params().top_logprobs > ops::kMaxTopLogprobs ||
           !s.sampler.params().logit_bias.empty();
  };
  // The rows the backend samples; when they are not simply every row (prompt-logprob rows or
  // host-sampled rows in the step), they are copied into a compact block first.
  std::vector<int64_t> dev_rows;
  std::vector<const Sequence*> dev_seqs;
  for (int64_t r = 0; r < rows; ++r) {
    const Sequence* s = row_seq[static_cast<size_t>(r)];
    if (row_sampled[static_cast<size_t>(r)] == 1 && !host_only(*s)) dev_rows.push_back(r), dev_seqs.push_back(s);
  }
  std::vector<SampleResult> drawn(static_cast<size_t>(rows));
  if (!dev_rows.empty()) {
    const auto n = static_cast<int64_t>(dev_rows.size());
    ops::OwnedTensor compact;
    Tensor block = logits;
    if (n != rows) {
      compact = be.alloc(DType::F32, {n, V});
      for (int64_t i = 0; i < n; ++i)
        be.copy({logits.f32() + dev_rows[static_cast<size_t>(i)] * V, V, compact.f32() + i * V, V, 1, V});
      block = compact.t;
    }
    std::vector<SampleResult> got = sample_on_backend(be, block, dev_seqs);
    for (int64_t i = 0; i < n; ++i)
      drawn[static_cast<size_t>(dev_rows[static_cast<size_t>(i)])] = std::move(got[static_cast<size_t>(i)]);
  }

  std::vector<SampleResult> results;
  std::vector<float> host(static_cast<size_t>(V));
  auto fetch = [&](int64_t r) -> std::span<float> {
    be.download(host.data(), Tensor{logits.f32() + r * V, DType::F32, {V}, logits.device});
    return host;
  };
  int64_t r = 0;
  for (const ScheduledSeq& it : out.seqs) {
    Sequence& s = *it.seq;
    for (int64_t p = it.start; p < it.start + it.num_tokens; ++p)
      if (wants_prompt_row(s, p)) record_prompt_logprob(s, p, fetch(r++));
    if (!it.sample) continue;
    if (it.num_draft > 0) {  // [1 + num_draft, V] to the host for the verifier; no result of its own
      KILN_CHECK(verify, "internal: request {} has drafts to verify but the caller takes no verify logits", s.id);
      std::vector<float> rows_here(static_cast<size_t>((1 + it.num_draft) * V));
      be.download(rows_here.data(), Tensor{logits.f32() + r * V, DType::F32, {1 + it.num_draft, V}, logits.device});
      verify->push_back(std::move(rows_here));
      r += 1 + it.num_draft;
      results.emplace_back();
      continue;
    }
    if (!host_only(s)) {
      results.push_back(std::move(drawn[static_cast<size_t>(r++)]));
      continue;
    }
    // Constrained (or very many top logprobs): on the host; a constraint masks the row first, so
    // the draw and the logprobs reported with it come from the masked distribution.
    std::span<float> l = fetch(r++);
    if (s.constraint) s.constraint->mask(l);
    results.push_back(s.sampler.sample(l, s.prompt(), s.output()));
  }
  last_device_seconds_ = be.elapsed_seconds(start, be.mark());
  return results;
}

}  // namespace kiln

#include "spec/hidden_states.h"

#include <algorithm>

#include "core/error.h"
#include "kv/block_allocator.h"

namespace kiln::spec {

std::vector<float> recompute_hidden(DeepseekV3Model& target, std::span<const HiddenRecompute> seqs,
                                    const std::vector<int32_t>& taps, int64_t block_size) {
  KILN_CHECK(!taps.empty(), "internal: recomputing hidden states with no tap");
  ForwardBatch b;
  b.cu_q.push_back(0);
  b.hidden_taps = taps;
  std::vector<std::vector<int32_t>> tables;
  int32_t blocks = 0;
  for (const HiddenRecompute& s : seqs) {
    if (s.positions.empty()) continue;
    KILN_CHECK(std::is_sorted(s.positions.begin(), s.positions.end()) && s.positions.front() >= 0 &&
                   s.positions.back() < static_cast<int64_t>(s.tokens.size()),
               "internal: hidden states wanted at positions outside a sequence of {} tokens", s.tokens.size());
    const int64_t len = s.positions.back() + 1;
    std::vector<int32_t>& table = tables.emplace_back();
    for (int64_t i = 0; i < kv::blocks_for(len, block_size); ++i) table.push_back(blocks++);
    const auto first = static_cast<int32_t>(b.tokens.size());
    for (int64_t p = 0; p < len; ++p) {
      b.tokens.push_back(s.tokens[static_cast<size_t>(p)]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.slot_mapping.push_back(kv::slot_of(table, p, block_size));
    }
    for (int64_t p : s.positions) b.hidden_rows.push_back(first + static_cast<int32_t>(p));
    b.cu_q.push_back(static_cast<int32_t>(b.tokens.size()));
    b.kv_lens.push_back(static_cast<int32_t>(len));
    b.max_blocks = std::max<int64_t>(b.max_blocks, static_cast<int64_t>(table.size()));
  }
  if (b.hidden_rows.empty()) return {};
  for (const auto& table : tables) {  // padded with block 0: past kv_len, never read
    b.block_tables.insert(b.block_tables.end(), table.begin(), table.end());
    b.block_tables.insert(b.block_tables.end(), static_cast<size_t>(b.max_blocks) - table.size(), 0);
  }
  b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));  // one row: no empty logits block
  LatentKvPool scratch = target.new_pool(blocks, block_size);
  target.forward_logits(b, scratch);
  const Tensor hs = target.hidden_states();  // [wanted, taps, H]
  std::vector<float> host(static_cast<size_t>(hs.numel()));
  target.backend().download(host.data(), hs);
  return host;
}

}  // namespace kiln::spec

#include "plan/report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <sstream>

#include "core/error.h"

namespace kiln::plan {
namespace {

using json = nlohmann::json;

std::string gb(double bytes) {
  return fmt::format("{:.1f} GB", bytes / 1e9);
}

// 1234567 -> "1,234,567".
std::string grouped(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string ms(double s) {
  return fmt::format("{:.2f} ms", s * 1e3);
}

std::string layout_name(const Layout& l) {
  return fmt::format("TP{} EP{} DP{} DCP{}", l.tp, l.ep, l.attn_dp, l.dcp);
}

std::string kv_name(int64_t bytes_per_value) {
  return bytes_per_value == 1 ? "fp8" : "bf16";
}

json step_json(const StepCost& s) {
  return {{"tokens", s.tokens},       {"distinct_experts", s.distinct_experts},
          {"bytes_per_gpu", s.bytes}, {"flops_per_gpu", s.flops},
          {"mem_s", s.mem_s},         {"compute_s", s.compute_s},
          {"comm_s", s.comm_s},       {"time_s", s.time_s},
          {"bound", s.bound}};
}

// Where a plan's GPU-hour price came from: a price the user gave, or the catalog's placeholder.
const char* price_source(const Plan& p) {
  return p.price_is_placeholder ? "catalog placeholder" : "given";
}

std::string step_line(const char* what, const StepCost& s) {
  return fmt::format("{} {} per step = max(memory {}, compute {}) + comm {}; {:.1f} distinct experts/layer, {}-bound",
                     what, ms(s.time_s), ms(s.mem_s), ms(s.compute_s), ms(s.comm_s), s.distinct_experts, s.bound);
}

int64_t parse_int(const std::string& v, const std::string& item, const char* key) {
  try {
    size_t used = 0;
    long long n = std::stoll(v, &used);
    KILN_CHECK(used == v.size() && n > 0, "bad");
    return n;
  } catch (const std::exception&) {
    fail("--compare item \"{}\": {} must be a positive integer, got \"{}\"", item, key, v);
  }
}

}  // namespace

int64_t parse_kv_dtype(const std::string& s) {
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (l == "bf16") return 2;
  if (l == "fp8" || l == "fp8-e4m3" || l == "fp8_e4m3") return 1;  // the serving flag's spellings too
  fail("--kv {}: unknown KV cache dtype (bf16, fp8)", s);
}

json plan_to_json(const Plan& p) {
  const Layout& l = p.layout;
  json roles = json::object();
  for (size_t r = 0; r < p.w.bytes_by_role.size(); ++r)
    if (p.w.bytes_by_role[r]) roles[weight_role_name(static_cast<WeightRole>(r))] = p.w.bytes_by_role[r];
  return {
      {"model", p.model},
      {"gpu", p.gpu},
      {"gpus", l.world()},
      {"layout",
       {{"gpus_per_node", l.gpus_per_node},
        {"nodes", l.nodes},
        {"tp", l.tp},
        {"ep", l.ep},
        {"attn_dp", l.attn_dp},
        {"dcp", l.dcp}}},
      {"weights", weight_format_name(p.weights)},
      {"kv_dtype", kv_name(p.kv_bytes_per_value)},
      {"workload",
       {{"input_len", p.workload.input_len},
        {"output_len", p.workload.output_len},
        {"concurrency", p.workload.concurrency},
        {"context", p.workload.context}}},
      {"params_total", p.w.params},
      {"bits_per_param", p.bits_per_param},
      {"fits", p.fits},
      {"margin_bytes_per_gpu", p.margin_bytes_per_gpu},
      {"weight_bytes_total", p.w.bytes},
      {"weight_scale_bytes_total", p.w.scale_bytes},
      {"weight_bytes_by_role", roles},
      {"weight_bytes_per_gpu", p.w.bytes_per_gpu},
      {"loaded_extra_bytes_per_gpu", p.w.loaded_extra_bytes_per_gpu},
      {"replicated_weight_bytes_per_gpu", p.w.replicated_bytes_per_gpu},
      {"usable_bytes_per_gpu", p.usable_bytes_per_gpu},
      {"reserve_bytes_per_gpu", p.reserve_bytes_per_gpu},
      {"kv_bytes_per_token", p.kv_bytes_per_token},
      {"kv_bytes_per_token_per_gpu", p.kv_bytes_per_token_per_gpu},
      {"kv_pool_bytes_per_gpu", p.kv_pool_bytes_per_gpu},
      {"kv_capacity_tokens", p.kv_capacity_tokens},
      {"max_sequences_at_context", p.max_sequences},
      {"required_kv_tokens", p.required_kv_tokens},
      {"required_kv_bytes_per_gpu", p.required_kv_bytes_per_gpu},
      {"decode_single", step_json(p.decode_single)},
      {"decode", step_json(p.decode)},
      {"prefill", step_json(p.prefill)},
      {"decode_tok_s_single_stream_ceiling", p.single_stream_tok_s},
      {"decode_tok_s_per_stream_ceiling", p.per_stream_tok_s},
      {"decode_aggregate_tok_s_ceiling", p.decode_aggregate_tok_s},
      {"prefill_tok_s_ceiling", p.prefill_tok_s},
      {"aggregate_tok_s_ceiling", p.aggregate_tok_s},
      {"usd_per_gpu_hour", p.usd_per_gpu_hour},
      {"usd_per_gpu_hour_source", price_source(p)},
      {"tok_s_per_gpu", p.tok_s_per_gpu},
      {"tok_s_per_usd_gpu_hour", p.tok_s_per_usd_gpu_hour},
      {"usd_per_million_tokens", p.usd_per_million_tokens},
      {"facility_watts", p.facility_watts},
      {"joules_per_token", p.joules_per_token},
  };
}

std::string format_plan(const Plan& p, const GpuSpec& gpu) {
  const Layout& l = p.layout;
  const auto& roles = p.w.bytes_by_role;
  auto role = [&](WeightRole r) { return static_cast<double>(roles[static_cast<size_t>(r)]); };
  std::ostringstream o;
  o << fmt::format("plan      {} on {} x {} ({} node{} x {}), {}, weights {}, KV {}\n", p.model, l.world(), p.gpu,
                   l.nodes, l.nodes > 1 ? "s" : "", l.gpus_per_node, layout_name(l), weight_format_name(p.weights),
                   kv_name(p.kv_bytes_per_value));
  o << fmt::format(
      "weights   {:.3f} T params in {} ({:.2f} bits/param, scales {}): routed experts {}, attention {}, "
      "shared {}, dense MLP {}, embedding + lm_head {}\n",
      static_cast<double>(p.w.params) / 1e12, gb(static_cast<double>(p.w.bytes)), p.bits_per_param,
      gb(static_cast<double>(p.w.scale_bytes)), gb(role(WeightRole::RoutedExpert)), gb(role(WeightRole::Attention)),
      gb(role(WeightRole::SharedExpert)), gb(role(WeightRole::DenseMlp)),
      gb(role(WeightRole::Embedding) + role(WeightRole::LmHead)));
  o << fmt::format("per GPU   usable {} = weights {} (replicated {}) + reserve {} + KV pool {}\n",
                   gb(p.usable_bytes_per_gpu), gb(p.w.bytes_per_gpu), gb(p.w.replicated_bytes_per_gpu),
                   gb(p.reserve_bytes_per_gpu), gb(p.kv_pool_bytes_per_gpu));
  o << fmt::format(
      "KV        {} B/token ({} layers x {}); one GPU holds {:.0f} B of each ({}); capacity "
      "{} tokens = {} sequences of {}\n",
      grouped(p.kv_bytes_per_token), p.layers,
      p.kv_bytes_per_value == 1  // the FP8 row's scales and bf16 k_pe are part of its bytes
          ? fmt::format("{} B rows: {} values, c_kv e4m3 + scale per 128, k_pe bf16", p.kv_bytes_per_token / p.layers,
                        p.kv_row_values)
          : fmt::format("{} values x {} B", p.kv_row_values, p.kv_bytes_per_value),
      p.kv_bytes_per_token_per_gpu,
      l.dcp > 1 ? fmt::format("split over DCP{}", l.dcp) : fmt::format("replicated on all {} TP ranks", l.tp),
      grouped(p.kv_capacity_tokens), grouped(p.max_sequences), grouped(p.workload.context));
  o << fmt::format("fit       weights + reserve + {} KV tokens ({} per GPU): {}, {} {}\n",
                   grouped(p.required_kv_tokens), gb(p.required_kv_bytes_per_gpu), p.fits ? "FITS" : "DOES NOT FIT",
                   gb(std::abs(p.margin_bytes_per_gpu)), p.fits ? "to spare" : "short");
  o << step_line("decode    batch 1:", p.decode_single) << "\n";
  if (p.workload.concurrency > 1)
    o << step_line(fmt::format("decode    batch {}:", p.workload.concurrency).c_str(), p.decode) << "\n";
  if (!p.fits) o << "ceiling   (the plan does not fit: the figures below are what it would do if it did)\n";
  o << fmt::format(
      "ceiling   single stream {:.1f} tok/s; at concurrency {} (in {}, out {}): {:.1f} tok/s per stream, "
      "{:.0f} tok/s aggregate ({:.0f} decode only, prefill {:.0f} tok/s)\n",
      p.single_stream_tok_s, p.workload.concurrency, p.workload.input_len, p.workload.output_len, p.per_stream_tok_s,
      p.aggregate_tok_s, p.decode_aggregate_tok_s, p.prefill_tok_s);
  o << fmt::format(
      "price     ${:.2f}/GPU-hour, {}\n", p.usd_per_gpu_hour,
      p.price_is_placeholder ? "the catalog's placeholder, not a quote: set yours with --gpu-price" : "as given");
  o << fmt::format(
      "cost      {}{:.1f} tok/s per GPU, {:.1f} tok/s per $/GPU-hr, ${:.3f} per M output tokens, {:.3f} J/token "
      "at {:.1f} kW\n",
      p.fits ? "" : "if it fit: ", p.tok_s_per_gpu, p.tok_s_per_usd_gpu_hour, p.usd_per_million_tokens,
      p.joules_per_token, p.facility_watts / 1e3);
  o << fmt::format("source    {}\n", gpu.source);
  return o.str();
}

std::string format_compare(const std::vector<Plan>& plans) {
  std::vector<std::pair<std::string, std::vector<std::string>>> rows;
  auto row = [&](const std::string& name, auto fn) {
    std::vector<std::string> cells;
    for (const auto& p : plans) cells.push_back(fn(p));
    rows.emplace_back(name, std::move(cells));
  };
  // Throughput and cost of a plan that does not fit would only mislead a reader scanning columns.
  auto fitting_row = [&](const std::string& name, auto fn) {
    row(name, [&](const Plan& p) { return p.fits ? fn(p) : std::string("-"); });
  };
  row("", [](const Plan& p) { return fmt::format("{} x{}", p.gpu, p.layout.world()); });
  row("layout", [](const Plan& p) { return layout_name(p.layout); });
  row("weights", [](const Plan& p) { return fmt::format("{} {}", weight_format_name(p.weights), gb(p.w.bytes)); });
  row("weights / GPU", [](const Plan& p) { return gb(p.w.bytes_per_gpu); });
  row("reserve / GPU", [](const Plan& p) { return gb(p.reserve_bytes_per_gpu); });
  row("usable / GPU", [](const Plan& p) { return gb(p.usable_bytes_per_gpu); });
  row("KV pool / GPU", [](const Plan& p) { return gb(p.kv_pool_bytes_per_gpu); });
  row("KV capacity (tokens)", [](const Plan& p) { return grouped(p.kv_capacity_tokens); });
  row("required KV (tokens)", [](const Plan& p) { return grouped(p.required_kv_tokens); });
  row("fits", [](const Plan& p) {
    return fmt::format("{} ({}{})", p.fits ? "yes" : "NO", p.fits ? "+" : "-", gb(std::abs(p.margin_bytes_per_gpu)));
  });
  row("sequences at context", [](const Plan& p) { return grouped(p.max_sequences); });
  row("concurrency", [](const Plan& p) { return grouped(p.workload.concurrency); });
  fitting_row("tok/s single stream", [](const Plan& p) { return fmt::format("{:.1f}", p.single_stream_tok_s); });
  fitting_row("tok/s per stream", [](const Plan& p) { return fmt::format("{:.1f}", p.per_stream_tok_s); });
  fitting_row("tok/s aggregate", [](const Plan& p) { return fmt::format("{:.0f}", p.aggregate_tok_s); });
  fitting_row("tok/s per GPU", [](const Plan& p) { return fmt::format("{:.1f}", p.tok_s_per_gpu); });
  row("$/GPU-hour", [](const Plan& p) {
    return fmt::format("{:.2f}{}", p.usd_per_gpu_hour, p.price_is_placeholder ? " (placeholder)" : "");
  });
  fitting_row("tok/s per $/GPU-hr", [](const Plan& p) { return fmt::format("{:.1f}", p.tok_s_per_usd_gpu_hour); });
  fitting_row("$ per M tokens", [](const Plan& p) { return fmt::format("{:.3f}", p.usd_per_million_tokens); });
  fitting_row("J / token", [](const Plan& p) { return fmt::format("{:.3f}", p.joules_per_token); });
  size_t name_w = 0;
  std::vector<size_t> col_w(plans.size(), 0);
  for (const auto& [name, cells] : rows) {
    name_w = std::max(name_w, name.size());
    for (size_t i = 0; i < cells.size(); ++i) col_w[i] = std::max(col_w[i], cells[i].size());
  }
  std::ostringstream o;
  for (const auto& [name, cells] : rows) {
    o << fmt::format("{:<{}}", name, name_w);
    for (size_t i = 0; i < cells.size(); ++i) o << fmt::format("  {:>{}}", cells[i], col_w[i]);
    o << "\n";
  }
  return o.str();
}

CompareItem parse_compare_item(const std::string& item) {
  CompareItem c;
  std::vector<std::string> parts;
  std::stringstream ss(item);
  for (std::string part; std::getline(ss, part, ':');) parts.push_back(part);
  KILN_CHECK(!parts.empty() && !parts[0].empty(), "--compare item \"{}\": needs a GPU name first", item);
  c.gpu = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    const size_t eq = part.find('=');
    if (eq == std::string::npos) {
      // GPUS or GPUSxNODES
      const size_t x = part.find_first_of("xX");
      c.gpus = parse_int(part.substr(0, x), item, "the GPU count");
      if (x != std::string::npos) c.nodes = parse_int(part.substr(x + 1), item, "the node count");
      continue;
    }
    const std::string key = part.substr(0, eq), value = part.substr(eq + 1);
    if (key == "tp")
      c.tp = parse_int(value, item, "tp");
    else if (key == "ep")
      c.ep = parse_int(value, item, "ep");
    else if (key == "dp" || key == "attn-dp")
      c.attn_dp = parse_int(value, item, "dp");
    else if (key == "dcp")
      c.dcp = parse_int(value, item, "dcp");
    else if (key == "weights")
      c.weights = parse_weight_format(value);
    else if (key == "kv")
      c.kv_bytes_per_value = parse_kv_dtype(value);
    else if (key == "price") {
      size_t used = 0;
      try {
        c.usd_per_gpu_hour = std::stod(value, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      KILN_CHECK(used == value.size() && c.usd_per_gpu_hour >= 0 && c.usd_per_gpu_hour <= 1e6,
                 "--compare item \"{}\": price must be a number of USD from 0 to 1e6, got \"{}\"", item, value);
    } else {
      fail("--compare item \"{}\": unknown key \"{}\" (tp, ep, dp, dcp, weights, kv, price)", item, key);
    }
  }
  return c;
}

std::vector<CompareItem> parse_compare_list(const std::string& list) {
  std::vector<CompareItem> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(parse_compare_item(item));
  KILN_CHECK(!out.empty(), "--compare needs at least one item (e.g. B200:8x2,B300:8)");
  return out;
}

}  // namespace kiln::plan

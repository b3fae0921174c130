#include "bench/svg.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kiln::bench {

std::vector<size_t> pareto_front(const std::vector<double>& x, const std::vector<double>& y) {
  std::vector<size_t> front;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!(x[i] > 0) || !(y[i] > 0)) continue;
    bool dominated = false;
    for (size_t j = 0; j < x.size() && !dominated; ++j)
      dominated = j != i && x[j] >= x[i] && y[j] >= y[i] && (x[j] > x[i] || y[j] > y[i]);
    if (!dominated) front.push_back(i);
  }
  std::sort(front.begin(), front.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
  return front;
}

namespace {

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

// A 1-2-5 step giving about `n` ticks over [0, hi].
double nice_step(double hi, int n) {
  if (!(hi > 0)) return 1;
  const double raw = hi / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag) return m * mag;
  return 10 * mag;
}

std::string tick_label(double v) {
  if (v >= 1000) return fmt::format("{:.0f}", v);
  if (v == std::floor(v)) return fmt::format("{:.0f}", v);
  return fmt::format("{:g}", v);
}

// The opening of a chart: the svg element of width w and height h on white, then the title and
// the subtitle at x.
std::string svg_open(double w, double h, double x, const std::string& title, const std::string& subtitle) {
  return fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"26\" font-size=\"16\" font-weight=\"bold\">{3}</text>\n"
      "<text x=\"{2}\" y=\"46\" fill=\"#555\">{4}</text>\n",
      w, h, x, escape(title), escape(subtitle));
}

}  // namespace

std::string render_chart(const std::vector<PointSummary>& points, const std::string& title,
                         const std::string& subtitle) {
  constexpr double W = 760, H = 500, L = 80, R = 30, T = 84, B = 60;  // canvas and margins, px
  // Per GPU when the sweep was told the GPU count (--gpus); the whole server's throughput otherwise.
  const bool per_gpu = !points.empty() && points.front().cost.gpus > 0;
  const char* y_name = per_gpu ? "tok/s per GPU" : "tok/s (whole server)";
  std::vector<double> x, y;
  for (const auto& p : points) {
    x.push_back(p.per_stream_decode_tok_s);
    y.push_back(per_gpu ? p.output_tok_s_per_gpu : p.output_tok_s);
  }
  const std::vector<size_t> front = pareto_front(x, y);
  const double xmax0 = x.empty() ? 1 : *std::max_element(x.begin(), x.end());
  const double ymax0 = y.empty() ? 1 : *std::max_element(y.begin(), y.end());
  const double xstep = nice_step(xmax0 * 1.1, 6), ystep = nice_step(ymax0 * 1.1, 6);
  const double xmax = std::max(1.0, std::ceil(xmax0 * 1.1 / xstep)) * xstep;
  const double ymax = std::max(1.0, std::ceil(ymax0 * 1.1 / ystep)) * ystep;
  auto px = [&](double v) { return L + v / xmax * (W - L - R); };
  auto py = [&](double v) { return H - B - v / ymax * (H - T - B); };

  std::string s = svg_open(W, H, L, title, subtitle);
  // Grid and ticks.
  for (double v = 0; v <= xmax + xstep / 2; v += xstep)
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eee\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}</text>\n",
        px(v), T, H - B, H - B + 16, tick_label(v));
  for (double v = 0; v <= ymax + ystep / 2; v += ystep)
    s += fmt::format(
        "<line x1=\"{0}\" y1=\"{1:.1f}\" x2=\"{2}\" y2=\"{1:.1f}\" stroke=\"#eee\"/>"
        "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5}</text>\n",
        L, py(v), W - R, L - 6, py(v) + 4, tick_label(v));
  s += fmt::format(
      "<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"{3}\" fill=\"none\" stroke=\"#333\"/>\n"
      "<text x=\"{4}\" y=\"{5}\" text-anchor=\"middle\">tok/s per user (1000 / mean TPOT)</text>\n"
      "<text transform=\"translate(20 {6}) rotate(-90)\" text-anchor=\"middle\">output {7}</text>\n",
      L, T, W - L - R, H - T - B, (L + W - R) / 2, H - 18, (T + H - B) / 2, y_name);
  // The Pareto front first, so the markers sit on top of it.
  if (!front.empty()) {
    std::string pts;
    for (size_t i : front) pts += fmt::format("{:.1f},{:.1f} ", px(x[i]), py(y[i]));
    s += fmt::format(
        "<polyline class=\"pareto-front\" points=\"{}\" fill=\"none\" stroke=\"#d62728\" "
        "stroke-width=\"2\"/>\n",
        pts);
  }
  for (size_t i = 0; i < points.size(); ++i) {
    const bool on_front = std::find(front.begin(), front.end(), i) != front.end();
    const auto& p = points[i];
    std::string label = p.concurrency > 0 ? fmt::format("c={}", p.concurrency) : std::string();
    if (std::isfinite(p.request_rate))
      label += fmt::format("{}{} req/s", label.empty() ? "" : " @ ", tick_label(p.request_rate));
    s += fmt::format(
        "<circle class=\"{}\" cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"5\" fill=\"{}\" stroke=\"{}\" stroke-width=\"1.5\">"
        "<title>{}: {:.1f} tok/s per user, {:.1f} {}</title></circle>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
        on_front ? "point pareto" : "point", px(x[i]), py(y[i]), on_front ? "#d62728" : "white",
        on_front ? "#d62728" : "#1f77b4", escape(label), x[i], y[i], y_name, px(x[i]) + 8, py(y[i]) - 8, escape(label));
  }
  // Legend, one row above the plot where it can hide no point.
  s += fmt::format(
      "<circle cx=\"{0}\" cy=\"{1}\" r=\"5\" fill=\"#d62728\"/><text x=\"{2}\" y=\"{3}\">Pareto front</text>\n"
      "<circle cx=\"{4}\" cy=\"{1}\" r=\"5\" fill=\"white\" stroke=\"#1f77b4\" stroke-width=\"1.5\"/>"
      "<text x=\"{5}\" y=\"{3}\">dominated point</text>\n",
      L + 5, T - 18, L + 14, T - 14, L + 125, L + 134);
  s += "</svg>\n";
  return s;
}

std::string render_bars(const std::vector<ResultBar>& bars, const std::string& title, const std::string& subtitle) {
  // Canvas: a label column, the bars over 0..xmax percent, the absolute figure right of each bar.
  constexpr double W = 900, L = 270, R = 150, T = 96, B = 44, kRow = 20, kHead = 28;
  double top = 1.0;  // at least 0-100%
  for (const ResultBar& b : bars) top = std::max(top, std::max(b.fraction, std::isnan(b.target) ? 0.0 : b.target));
  const double xstep = nice_step(top * 100, 10), xmax = std::ceil(top * 100 / xstep) * xstep;
  double h = T + B;
  for (size_t i = 0; i < bars.size(); ++i) h += kRow + (i == 0 || bars[i].group != bars[i - 1].group ? kHead : 0);
  auto px = [&](double percent) { return L + percent / xmax * (W - L - R); };

  std::string s = svg_open(W, h, 16, title, subtitle);
  // Legend, then the percent grid over the whole plot.
  s += fmt::format(
      "<rect x=\"16\" y=\"58\" width=\"14\" height=\"10\" fill=\"#2ca02c\"/>"
      "<text x=\"36\" y=\"67\">meets its target</text>"
      "<rect x=\"146\" y=\"58\" width=\"14\" height=\"10\" fill=\"#ff7f0e\"/>"
      "<text x=\"166\" y=\"67\">short of its target</text>"
      "<rect x=\"290\" y=\"58\" width=\"14\" height=\"10\" fill=\"#1f77b4\"/>"
      "<text x=\"310\" y=\"67\">no target</text>"
      "<line x1=\"394\" y1=\"56\" x2=\"394\" y2=\"70\" stroke=\"#d62728\" stroke-width=\"2\"/>"
      "<text x=\"400\" y=\"67\">target</text>\n");
  for (double v = 0; v <= xmax + xstep / 2; v += xstep)
    s += fmt::format(
        "<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#eee\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4}%</text>\n",
        px(v), T - 4, h - B, h - B + 16, tick_label(v));
  double y = T;
  for (size_t i = 0; i < bars.size(); ++i) {
    const ResultBar& b = bars[i];
    if (i == 0 || b.group != bars[i - 1].group) {
      s += fmt::format("<text x=\"16\" y=\"{:.1f}\" font-weight=\"bold\">{}</text>\n", y + kHead - 8, escape(b.group));
      y += kHead;
    }
    const bool has_target = !std::isnan(b.target);
    const char* fill = !has_target ? "#1f77b4" : b.fraction >= b.target ? "#2ca02c" : "#ff7f0e";
    const double pct = b.fraction * 100, bar = std::max(0.0, pct);  // the text keeps a negative value
    s += fmt::format(
        "<g class=\"bar\"><title>{0}: {1}, {2:.1f}%{3}</title>"
        "<text x=\"{4}\" y=\"{5:.1f}\" text-anchor=\"end\">{0}</text>"
        "<rect x=\"{6}\" y=\"{7:.1f}\" width=\"{8:.1f}\" height=\"{9}\" fill=\"{10}\"/>"
        "<text x=\"{11:.1f}\" y=\"{5:.1f}\">{2:.1f}%  {1}</text>",
        escape(b.label), escape(b.value), pct, has_target ? fmt::format(" (target {:.0f}%)", b.target * 100) : "",
        L - 8, y + kRow - 6, L, y + 3, px(bar) - L, kRow - 6, fill,
        px(std::max(bar, has_target ? b.target * 100 : 0.0)) + 6);  // the text clears the target tick
    if (has_target)
      s += fmt::format(
          "<line class=\"target\" x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" "
          "stroke=\"#d62728\" stroke-width=\"2\"/>",
          px(b.target * 100), y + 1, y + kRow - 1);
    s += "</g>\n";
    y += kRow;
  }
  s += "</svg>\n";
  return s;
}

}  // namespace kiln::bench

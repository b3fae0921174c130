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

}  // namespace

std::string render_chart(const std::vector<PointSummary>& points, const std::string& title,
                         const std::string& subtitle) {
  constexpr double W = 760, H = 500, L = 80, R = 30, T = 84, B = 60;  // canvas and margins, px
  std::vector<double> x, y;
  for (const auto& p : points) {
    x.push_back(p.per_stream_decode_tok_s);
    y.push_back(p.output_tok_s_per_gpu);
  }
  const std::vector<size_t> front = pareto_front(x, y);
  const double xmax0 = x.empty() ? 1 : *std::max_element(x.begin(), x.end());
  const double ymax0 = y.empty() ? 1 : *std::max_element(y.begin(), y.end());
  const double xstep = nice_step(xmax0 * 1.1, 6), ystep = nice_step(ymax0 * 1.1, 6);
  const double xmax = std::max(1.0, std::ceil(xmax0 * 1.1 / xstep)) * xstep;
  const double ymax = std::max(1.0, std::ceil(ymax0 * 1.1 / ystep)) * ystep;
  auto px = [&](double v) { return L + v / xmax * (W - L - R); };
  auto py = [&](double v) { return H - B - v / ymax * (H - T - B); };

  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} {1}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{2}\" y=\"26\" font-size=\"16\" font-weight=\"bold\">{3}</text>\n"
      "<text x=\"{2}\" y=\"46\" fill=\"#555\">{4}</text>\n",
      W, H, L, escape(title), escape(subtitle));
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
      "<text transform=\"translate(20 {6}) rotate(-90)\" text-anchor=\"middle\">output tok/s per GPU</text>\n",
      L, T, W - L - R, H - T - B, (L + W - R) / 2, H - 18, (T + H - B) / 2);
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
        "<title>{}: {:.1f} tok/s per user, {:.1f} tok/s per GPU</title></circle>"
        "<text x=\"{:.1f}\" y=\"{:.1f}\">{}</text>\n",
        on_front ? "point pareto" : "point", px(x[i]), py(y[i]), on_front ? "#d62728" : "white",
        on_front ? "#d62728" : "#1f77b4", escape(label), x[i], y[i], px(x[i]) + 8, py(y[i]) - 8, escape(label));
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

}  // namespace kiln::bench

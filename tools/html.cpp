// `cupool report --html`: one self-contained page (inline CSS and SVG, no script, no external
// resource), so it opens offline and in any browser. Charts: memory over time (requested, in use,
// reserved, cap) with out-of-memory markers, fragmentation over time, latency histograms.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "cli.h"
#include "report.h"

namespace cupool::tools {

namespace {

std::string esc(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

struct Line {
  std::string key;    // data-series
  std::string label;
  std::string color;
  std::vector<std::pair<double, double>> points;  // (x, y), x ascending
  bool dashed = false;
  bool step = true;
};

// A filled range under the lines: from lo to hi at each step.
struct Band {
  std::string key;
  std::string label;
  std::string color;
  std::vector<std::array<double, 3>> points;  // (x, lo, hi), x ascending
};

struct Marker {
  double x;
  std::string text;
};

enum class YFormat { bytes, percent, count };

constexpr double kW = 880, kH = 240, kLeft = 78, kRight = 16, kTop = 14, kBottom = 34;

// A "nice" axis end and step: 1, 2 or 5 times a power of ten (of 1024 for bytes).
std::pair<double, double> nice_axis(double max, bool binary) {
  if (max <= 0) max = 1;
  const double base = binary ? 1024.0 : 10.0;
  double unit = 1;
  if (binary) {
    while (max / unit >= 1024.0) unit *= 1024.0;
  }
  const double scaled = max / unit / 4;  // about four steps
  const double p = std::pow(10.0, std::floor(std::log10(scaled)));
  double step = p;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0})
    if (m * p >= scaled) {
      step = m * p;
      break;
    }
  (void)base;
  step *= unit;
  return {std::ceil(max / step) * step, step};
}

std::string y_label(double v, YFormat f) {
  if (f == YFormat::percent) return num(v * 100).substr(0, num(v * 100).size() - 2) + "%";
  if (f == YFormat::count) return std::to_string(static_cast<long long>(v));
  return human_size(static_cast<std::uint64_t>(v));
}

// An x-axis label centred on its tick, or ending at it near the right edge (where a centred
// label would run past the chart and be cut off).
std::string x_label(double x, const std::string& text) {
  const bool at_right = x > kW - kRight - 40;
  return "<text class=\"xlab" + std::string(at_right ? " end" : "") + "\" x=\"" + num(x) + "\" y=\"" +
         num(kH - kBottom + 16) + "\">" + esc(text) + "</text>\n";
}

std::string time_label(double s, double span) {
  char buf[32];
  if (span < 0.01) std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  else if (span < 10) std::snprintf(buf, sizeof buf, "%.*f s", span < 0.1 ? 3 : span < 1 ? 2 : 1, s);
  else std::snprintf(buf, sizeof buf, "%.0f s", s);
  return buf;
}

// One chart over time. x in seconds since the first event.
std::string time_chart(const std::string& kind, const std::string& title, double x_max, const std::vector<Line>& lines,
                       YFormat yf, const std::vector<Marker>& markers, double y_fixed_max = 0,
                       const std::vector<Band>& bands = {}) {
  if (x_max <= 0) x_max = 1e-6;
  double y_data = 0;
  for (const auto& l : lines)
    for (const auto& p : l.points) y_data = std::max(y_data, p.second);
  for (const auto& b : bands)
    for (const auto& p : b.points) y_data = std::max(y_data, p[2]);
  auto [y_max, y_step] = y_fixed_max > 0 ? std::pair<double, double>{y_fixed_max, y_fixed_max / 4}
                                         : nice_axis(y_data, yf == YFormat::bytes);
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto X = [&](double x) { return kLeft + pw * std::clamp(x / x_max, 0.0, 1.0); };
  auto Y = [&](double y) { return kTop + ph * (1 - std::clamp(y / y_max, 0.0, 1.0)); };

  std::string s = "<figure class=\"chart-box\"><figcaption>" + esc(title) + "</figcaption>\n";
  s += "<svg class=\"chart\" data-chart=\"" + kind + "\" viewBox=\"0 0 " + num(kW) + " " + num(kH) +
       "\" width=\"" + num(kW) + "\" height=\"" + num(kH) + "\" role=\"img\">\n";
  s += "<rect class=\"plot\" x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" + num(pw) + "\" height=\"" +
       num(ph) + "\"/>\n";
  // Grid and axes.
  for (double y = 0; y <= y_max * 1.0001; y += y_step) {
    s += "<line class=\"grid\" x1=\"" + num(kLeft) + "\" x2=\"" + num(kLeft + pw) + "\" y1=\"" + num(Y(y)) + "\" y2=\"" +
         num(Y(y)) + "\"/><text class=\"ylab\" x=\"" + num(kLeft - 6) + "\" y=\"" + num(Y(y) + 4) + "\">" +
         esc(y_label(y, yf)) + "</text>\n";
  }
  auto [x_end, x_step] = nice_axis(x_max, false);
  (void)x_end;
  for (double x = 0; x <= x_max * 1.0001; x += x_step) {
    s += "<line class=\"grid\" x1=\"" + num(X(x)) + "\" x2=\"" + num(X(x)) + "\" y1=\"" + num(kTop) + "\" y2=\"" +
         num(kTop + ph) + "\"/>" + x_label(X(x), time_label(x, x_max));
  }
  s += "<text class=\"xtitle\" x=\"" + num(kLeft + pw) + "\" y=\"" + num(kH - 2) + "\">time since the first event</text>\n";
  // Bands under the lines: along hi to the right, back along lo.
  for (const auto& b : bands) {
    if (b.points.empty()) continue;
    const auto& pts = b.points;
    std::string d = "M" + num(X(pts.front()[0])) + " " + num(Y(pts.front()[2]));
    for (std::size_t i = 1; i < pts.size(); ++i) d += "H" + num(X(pts[i][0])) + "V" + num(Y(pts[i][2]));
    d += "H" + num(X(x_max)) + "V" + num(Y(pts.back()[1]));
    for (std::size_t i = pts.size() - 1; i > 0; --i) d += "H" + num(X(pts[i][0])) + "V" + num(Y(pts[i - 1][1]));
    d += "H" + num(X(pts.front()[0])) + "Z";
    s += "<path class=\"band\" data-series=\"" + b.key + "\" data-points=\"" + std::to_string(pts.size()) + "\" d=\"" +
         d + "\" fill=\"" + b.color + "\"><title>" + esc(b.label) + "</title></path>\n";
  }
  // Series.
  for (const auto& l : lines) {
    if (l.points.empty()) continue;
    std::string d = "M" + num(X(l.points.front().first)) + " " + num(Y(l.points.front().second));
    for (std::size_t i = 1; i < l.points.size(); ++i) {
      if (l.step) d += "H" + num(X(l.points[i].first)) + "V" + num(Y(l.points[i].second));
      else d += "L" + num(X(l.points[i].first)) + " " + num(Y(l.points[i].second));
    }
    if (l.step) d += "H" + num(X(x_max));
    s += "<path class=\"series\" data-series=\"" + l.key + "\" data-points=\"" + std::to_string(l.points.size()) +
         "\" d=\"" + d + "\" stroke=\"" + l.color + "\"" + (l.dashed ? " stroke-dasharray=\"6 4\"" : "") +
         "><title>" + esc(l.label) + "</title></path>\n";
  }
  // Out-of-memory markers.
  for (const auto& m : markers) {
    const double x = X(m.x);
    s += "<g class=\"oom\"><line x1=\"" + num(x) + "\" x2=\"" + num(x) + "\" y1=\"" + num(kTop) + "\" y2=\"" +
         num(kTop + ph) + "\"/><path d=\"M" + num(x - 6) + " " + num(kTop) + "L" + num(x + 6) + " " + num(kTop) + "L" +
         num(x) + " " + num(kTop + 10) + "Z\"/><title>" + esc(m.text) + "</title></g>\n";
  }
  s += "</svg>\n<div class=\"legend\">";
  for (const auto& l : lines)
    s += "<span><i style=\"background:" + l.color + "\"></i>" + esc(l.label) + "</span>";
  for (const auto& b : bands)
    s += "<span><i class=\"band-key\" style=\"background:" + b.color + "\"></i>" + esc(b.label) + "</span>";
  if (!markers.empty()) s += "<span><i class=\"oom-key\"></i>out of memory (" + std::to_string(markers.size()) + ")</span>";
  s += "</div></figure>\n";
  return s;
}

double secs(std::uint64_t rel_ns) { return static_cast<double>(rel_ns) / 1e9; }

// A series' buckets as steps: each bucket's figure from its start (`held` false); where the
// next bucket with a value is not adjacent, and after the last, its last value holds (`held`).
// So a process that exited drops at its exit, and a gap shows the value that held over it.
struct Step {
  double x;
  const Series::Point* p;
  bool held;
};
std::vector<Step> steps(const std::vector<Series::Point>& points, std::uint64_t width) {
  std::vector<Step> out;
  for (std::size_t i = 0; i < points.size(); ++i) {
    out.push_back({secs(points[i].t), &points[i], false});
    if (i + 1 == points.size() || points[i + 1].t > points[i].t + width)
      out.push_back({secs(points[i].t + width), &points[i], true});
  }
  return out;
}

// Requested is drawn last, dashed: it is often the same as in use, and would hide under it.
std::vector<Line> memory_lines(const Series& series, std::uint64_t cap, double x_max) {
  std::vector<Line> lines = {{"reserved", "reserved", "#ff7f0e", {}, false, true},
                             {"in_use", "in use", "#2ca02c", {}, false, true},
                             {"requested", "requested (dashed)", "#1f77b4", {}, true, true}};
  const std::vector<Series::Point> points = series.points();
  for (const Step& st : steps(points, series.width())) {
    const Memory& m = st.held ? st.p->last : st.p->max;
    lines[0].points.emplace_back(st.x, static_cast<double>(m.reserved));
    lines[1].points.emplace_back(st.x, static_cast<double>(m.in_use));
    lines[2].points.emplace_back(st.x, static_cast<double>(m.requested));
  }
  // A cap far above the data would flatten it: then the legend names it and no line is drawn.
  std::uint64_t top = 0;
  for (const auto& p : points) top = std::max({top, p.max.reserved, p.max.in_use, p.max.requested});
  if (cap && cap <= 2 * top)
    lines.insert(lines.begin(), {"cap", "cap " + human_size(cap), "#d62728", {{0, double(cap)}, {x_max, double(cap)}}, true, false});
  else if (cap)
    lines.insert(lines.begin(), {"cap", "cap " + human_size(cap) + " (above the chart)", "#d62728", {}, true, false});
  return lines;
}

// Fragmentation: each bucket's time-weighted mean as the line, its min to max as a band (a
// bucket's maximum alone shows a moment's spike as a plateau).
struct FragChart {
  std::vector<Line> lines;
  std::vector<Band> bands;
};
FragChart frag_chart(const Series& series) {
  const std::string every = human_duration(series.width());
  FragChart c;
  c.lines = {{"fragmentation", "external fragmentation (1 - largest free / free): time-weighted mean per " + every,
              "#9467bd", {}, false, true}};
  c.bands = {{"fragmentation-range", "its min to max within each " + every, "#9467bd", {}}};
  const std::vector<Series::Point> points = series.points();
  for (const Step& st : steps(points, series.width())) {
    const Series::Point& p = *st.p;
    c.lines[0].points.emplace_back(st.x, st.held ? p.frag_last : p.frag_mean);
    c.bands[0].points.push_back({st.x, st.held ? p.frag_last : p.frag_min, st.held ? p.frag_last : p.frag_max});
  }
  return c;
}

// Latency: one step outline per API over log-scaled buckets (4 per power of two).
std::string latency_chart(const std::string& title, const std::vector<const ApiStats*>& apis) {
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"};
  std::uint64_t lo = ~std::uint64_t{0}, hi = 0;
  for (const ApiStats* a : apis) {
    lo = std::min(lo, std::max<std::uint64_t>(a->latency.min(), 1));
    hi = std::max(hi, a->latency.max());
  }
  if (apis.empty() || hi == 0) return "";
  const double l0 = std::floor(std::log10(static_cast<double>(lo)));
  const double l1 = std::max(l0 + 1, std::ceil(std::log10(static_cast<double>(hi) + 1)));
  constexpr int kPerDecade = 10;
  const int nbins = static_cast<int>((l1 - l0) * kPerDecade);
  std::vector<std::vector<double>> bins(apis.size(), std::vector<double>(static_cast<std::size_t>(nbins), 0));
  double y_data = 0;
  for (std::size_t a = 0; a < apis.size(); ++a) {
    const auto& b = apis[a]->latency.buckets();
    for (int i = 0; i < LatencyHistogram::kBuckets; ++i) {
      if (!b[static_cast<std::size_t>(i)]) continue;
      const double v = std::max<double>(1, static_cast<double>(LatencyHistogram::lower_bound(i)));
      int bin = static_cast<int>((std::log10(v) - l0) * kPerDecade);
      bin = std::clamp(bin, 0, nbins - 1);
      bins[a][static_cast<std::size_t>(bin)] += static_cast<double>(b[static_cast<std::size_t>(i)]);
    }
    for (double c : bins[a]) y_data = std::max(y_data, c);
  }
  auto [y_max, y_step] = nice_axis(y_data, false);
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  auto X = [&](double bin) { return kLeft + pw * bin / nbins; };
  auto Y = [&](double y) { return kTop + ph * (1 - std::clamp(y / y_max, 0.0, 1.0)); };
  std::string s = "<figure class=\"chart-box\"><figcaption>" + esc(title) + "</figcaption>\n";
  s += "<svg class=\"chart\" data-chart=\"latency\" viewBox=\"0 0 " + num(kW) + " " + num(kH) + "\" width=\"" + num(kW) +
       "\" height=\"" + num(kH) + "\" role=\"img\">\n";
  s += "<rect class=\"plot\" x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" + num(pw) + "\" height=\"" +
       num(ph) + "\"/>\n";
  for (double y = 0; y <= y_max * 1.0001; y += y_step)
    s += "<line class=\"grid\" x1=\"" + num(kLeft) + "\" x2=\"" + num(kLeft + pw) + "\" y1=\"" + num(Y(y)) + "\" y2=\"" +
         num(Y(y)) + "\"/><text class=\"ylab\" x=\"" + num(kLeft - 6) + "\" y=\"" + num(Y(y) + 4) + "\">" +
         std::to_string(static_cast<long long>(y)) + "</text>\n";
  for (int d = 0; d <= static_cast<int>(l1 - l0); ++d) {
    const double x = X(d * kPerDecade);
    s += "<line class=\"grid\" x1=\"" + num(x) + "\" x2=\"" + num(x) + "\" y1=\"" + num(kTop) + "\" y2=\"" + num(kTop + ph) +
         "\"/>" + x_label(x, human_duration(static_cast<std::uint64_t>(std::pow(10.0, l0 + d))));
  }
  s += "<text class=\"xtitle\" x=\"" + num(kLeft + pw) + "\" y=\"" + num(kH - 2) + "\">call duration (log scale); calls per bin</text>\n";
  for (std::size_t a = 0; a < apis.size(); ++a) {
    const std::string color = kColors[a % 8];
    std::string d = "M" + num(X(0)) + " " + num(Y(0));
    for (int i = 0; i < nbins; ++i)
      d += "V" + num(Y(bins[a][static_cast<std::size_t>(i)])) + "H" + num(X(i + 1));
    d += "V" + num(Y(0));
    s += "<path class=\"series hist\" data-series=\"" + esc(apis[a]->api) + "\" data-points=\"" + std::to_string(nbins) +
         "\" d=\"" + d + "\" stroke=\"" + color + "\" fill=\"" + color + "\" fill-opacity=\"0.15\"><title>" +
         esc(apis[a]->api) + "</title></path>\n";
  }
  s += "</svg>\n<div class=\"legend\">";
  for (std::size_t a = 0; a < apis.size(); ++a)
    s += "<span><i style=\"background:" + std::string(kColors[a % 8]) + "\"></i>" + esc(apis[a]->api) + " (" +
         std::to_string(apis[a]->count) + " calls, p50 " + human_duration(apis[a]->latency.quantile(0.5)) +
         ", p99 " + human_duration(apis[a]->latency.quantile(0.99)) + ", max " + human_duration(apis[a]->latency.max()) +
         ")</span>";
  s += "</div></figure>\n";
  return s;
}

constexpr const char* kStyle = R"(
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#222;background:#fafafa}
h1{font-size:22px;margin:0 0 4px} h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:16px 0 6px} .sub{color:#666}
table{border-collapse:collapse;margin:8px 0;background:#fff;max-width:100%} td,th{border:1px solid #ddd;padding:3px 6px;text-align:right}
th:first-child,td:first-child{text-align:left} th{background:#f0f0f0} th[colspan]{text-align:center}
table.summary{font-size:13px} table.summary td:first-child{min-width:8em}
@media (max-width:900px){body{margin:12px}}
table.summary td:first-child,table.left td{overflow-wrap:anywhere}
.traces{display:flex;flex-wrap:wrap;gap:0 16px} .traces section{width:900px;max-width:100%}
.legend{max-width:880px}
.chart-box{margin:8px 0;background:#fff;border:1px solid #ddd;padding:8px;display:inline-block;max-width:100%;box-sizing:border-box}
svg.chart{display:block;max-width:100%;height:auto}
figcaption{font-weight:600;margin-bottom:4px}
svg.chart .plot{fill:#fff;stroke:#999} svg.chart .grid{stroke:#eee} svg.chart text{font-size:11px;fill:#555}
svg.chart .ylab{text-anchor:end} svg.chart .xlab{text-anchor:middle} svg.chart .xlab.end{text-anchor:end}
svg.chart .xtitle{text-anchor:end;font-style:italic}
table.left td{text-align:left}
svg.chart path.series{fill:none;stroke-width:1.8} svg.chart path.hist{stroke-width:1.4}
svg.chart path.band{stroke:none;fill-opacity:0.22} .legend i.band-key{opacity:0.35}
svg.chart .oom line{stroke:#d62728;stroke-dasharray:3 3} svg.chart .oom path{fill:#d62728}
.legend span{margin-right:16px;font-size:12px} .legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-2px}
.legend i.oom-key{background:#d62728;clip-path:polygon(0 0,100% 0,50% 100%)}
.warn{color:#b00;font-weight:600} pre{background:#fff;border:1px solid #ddd;padding:8px;overflow:auto}
)";

std::string oom_marker_text(const OomInfo& o, std::uint64_t origin) {
  std::string t = oom_text(o, origin);
  if (o.has_pool) t += "; pool " + pool_state_text(o.pool);
  return t;
}

}  // namespace

std::string report_html(const Analysis& a) {
  const std::uint64_t origin = a.origin();
  const double x_max = secs(a.end() - origin);
  const auto& sources = a.sources();
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>cupool report</title>\n<style>";
  h += kStyle;
  h += "</style></head><body>\n<h1>cupool report</h1>\n<div class=\"sub\">" + std::to_string(sources.size()) +
       (sources.size() == 1 ? " trace, " : " traces, ") + std::to_string(a.events()) + " events over " +
       esc(human_duration(a.end() - origin)) + "; times are since the first event</div>\n";

  // Summary table: one row per trace and device.
  h += "<h2>Summary</h2>\n<table class=\"summary\"><tr><th rowspan=\"2\">trace</th><th rowspan=\"2\">device</th>"
       "<th rowspan=\"2\">policy</th><th colspan=\"3\">peak</th><th rowspan=\"2\">reserved / in use</th>"
       "<th colspan=\"2\">fragmentation</th><th rowspan=\"2\">out of memory</th><th rowspan=\"2\">writer drops</th></tr>\n"
       "<tr><th>requested</th><th>in use</th><th>reserved</th><th>at peak in use</th><th>mean over time</th></tr>\n";
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const auto& s = sources[i];
    for (const auto& [dev, d] : s.devices) {
      char ratio[32];
      std::snprintf(ratio, sizeof ratio, "%.3f", d.reserved_ratio());
      h += "<tr><td>#" + std::to_string(i + 1) + " " + esc(s.meta.label()) + "</td><td>" + std::to_string(dev) + "</td><td>" +
           esc(s.meta.policy) + "</td><td>" + human_size(d.peak_requested) + "</td><td>" + human_size(d.peak_in_use) +
           "</td><td>" + human_size(d.peak_reserved) + "</td><td>" + ratio + "</td><td>" +
           percent(d.peak_in_use_memory.fragmentation()) + "</td><td>" + percent(d.frag_mean()) + "</td><td>" +
           std::to_string(d.ooms) + "</td><td>" + (s.dropped ? "<span class=\"warn\">" + std::to_string(s.dropped) + "</span>" : "0") +
           "</td></tr>\n";
    }
  }
  h += "</table>\n";

  // All processes per device, summed at each moment.
  if (sources.size() > 1) {
    h += "<h2>Per device, all traces summed</h2>\n";
    for (const auto& [dev, t] : a.totals()) {
      std::vector<Marker> markers;
      for (const auto& s : sources)
        for (const auto& o : s.ooms)
          if (o.device == dev) markers.push_back({secs(o.t > origin ? o.t - origin : 0), s.meta.label() + ": " + oom_marker_text(o, origin)});
      h += time_chart("memory", device_title(t.info, dev) + ": memory over time, " + std::to_string(t.processes) +
                                    " processes summed (peak in use " + human_size(t.peak_in_use) + ", peak reserved " +
                                    human_size(t.peak_reserved) + ")",
                      x_max, memory_lines(t.series, t.info.total_bytes, x_max), YFormat::bytes, markers);
    }
  }

  // Each trace: side by side on a wide screen.
  h += "<h2>" + std::string(sources.size() > 1 ? "Each trace" : "Memory") + "</h2>\n<div class=\"traces\">\n";
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const auto& s = sources[i];
    h += "<section class=\"trace\"><h3>#" + std::to_string(i + 1) + " " + esc(s.meta.path) + ": " + esc(s.meta.label()) + "</h3>\n";
    if (!s.has_footer) h += "<div class=\"warn\">no footer: the process did not exit normally; the trace ends early</div>\n";
    if (s.dropped) h += "<div class=\"warn\">the writer dropped " + std::to_string(s.dropped) + " events</div>\n";
    if (!s.truncated.empty()) h += "<div class=\"warn\">" + esc(s.truncated) + ": ignored</div>\n";
    for (const auto& [dev, d] : s.devices) {
      std::vector<Marker> markers;
      for (const auto& o : s.ooms)
        if (o.device == dev) markers.push_back({secs(o.t > origin ? o.t - origin : 0), oom_marker_text(o, origin)});
      h += time_chart("memory", device_title(d.info, dev) + ": memory over time", x_max,
                      memory_lines(d.series, d.cap, x_max), YFormat::bytes, markers);
      const FragChart frag = frag_chart(d.series);
      h += time_chart("fragmentation", device_title(d.info, dev) + ": fragmentation over time", x_max, frag.lines,
                      YFormat::percent, markers, 1.0, frag.bands);
    }
    std::vector<const ApiStats*> apis;
    for (const auto& api : s.apis)
      if (api.latency.count()) apis.push_back(&api);
    h += latency_chart("call latency", apis);
    if (s.oom_count) {
      h += "<h3>Out of memory (" + std::to_string(s.oom_count) + ")</h3><table class=\"left\"><tr><th>when</th><th>what</th><th>pool</th></tr>\n";
      for (const auto& o : s.ooms)
        h += "<tr><td>" + esc(at_time(o.t, origin)) + "</td><td>" + esc(oom_text(o, origin)) + "</td><td>" +
             (o.has_pool ? esc(pool_state_text(o.pool)) : "") + "</td></tr>\n";
      h += "</table>\n";
    }
    h += "</section>\n";
  }
  h += "</div>\n<h2>Text report</h2>\n<details><summary>cupool report, as text</summary><pre>" + esc(report_text(a)) +
       "</pre></details>\n</body></html>\n";
  return h;
}

}  // namespace cupool::tools

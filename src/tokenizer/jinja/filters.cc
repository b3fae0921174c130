// Jinja's builtin filters with Python semantics, plus transformers' `tojson` override
// (json.dumps with ensure_ascii=False and its indent / separators / sort_keys).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>

#include "core/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/methods.h"
#include "tokenizer/unicode.h"

namespace kiln::jinja {

namespace {

using T = Value::Type;

const Value* opt(const Args& a, const char* name, size_t i) {
  const Value* v = a.get(name, i);
  return v && !v->is_none() ? v : nullptr;
}

bool flag(const Args& a, const char* name, size_t i, bool dflt) {
  const Value* v = a.get(name, i);
  return v ? truthy(*v) : dflt;
}

// attribute="a.b" or attribute=0: Jinja's make_attrgetter (dotted path, integer parts index).
Value attr_path(const Value& v, const Value& attribute) {
  if (attribute.is_number()) return get_item(v, attribute);
  Value cur = v;
  std::string path = py_str(attribute);
  size_t pos = 0;
  for (;;) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    int64_t index = 0;
    auto r = std::from_chars(part.data(), part.data() + part.size(), index);
    bool digits = !part.empty() && r.ec == std::errc() && r.ptr == part.data() + part.size() && part[0] != '-';
    cur = digits ? get_item(cur, Value::integer(index)) : get_item(cur, Value::string(part));
    if (dot == std::string::npos) return cur;
    if (cur.is_undefined()) return cur;
    pos = dot + 1;
  }
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(tok::lower(v.s));
  return v;
}

Value select(Interpreter& in, const Value& v, const Args& a, bool by_attr, bool keep) {
  std::vector<Value> out;
  size_t test_at = by_attr ? 1 : 0;
  const Value* attribute = by_attr ? a.get("attribute", 0) : nullptr;
  KILN_CHECK(!by_attr || attribute, "{} needs an attribute name", keep ? "selectattr" : "rejectattr");
  Args targs;
  for (size_t k = test_at + 1; k < a.pos.size(); ++k) targs.pos.push_back(a.pos[k]);
  std::string test = a.pos.size() > test_at ? py_str(a.pos[test_at]) : "";
  for (const Value& item : iterate(v)) {
    Value x = attribute ? attr_path(item, *attribute) : item;
    bool r = test.empty() ? truthy(x) : apply_test(in, test, x, targs);
    if (r == keep) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

Value map_filter(Interpreter& in, const Value& v, const Args& a) {
  std::vector<Value> out;
  const Value* attribute = nullptr;
  for (const auto& [k, x] : a.kw)
    if (k == "attribute") attribute = &x;
  if (attribute) {
    const Value* dflt = nullptr;
    for (const auto& [k, x] : a.kw)
      if (k == "default") dflt = &x;
    for (const Value& item : iterate(v)) {
      Value x = attr_path(item, *attribute);
      out.push_back(x.is_undefined() && dflt ? *dflt : x);
    }
    return Value::make_list(std::move(out));
  }
  KILN_CHECK(!a.pos.empty(), "map needs a filter name or attribute=");
  std::string fname = py_str(a.pos[0]);
  Args fargs;
  fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
  fargs.kw = a.kw;
  for (const Value& item : iterate(v)) out.push_back(apply_filter(in, fname, item, fargs));
  return Value::make_list(std::move(out));
}

Value sorted(const Value& v, const Args& a) {
  std::vector<Value> items = iterate(v);
  bool reverse = flag(a, "reverse", 0, false), cs = flag(a, "case_sensitive", 1, false);
  const Value* attribute = opt(a, "attribute", 2);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& x : items) keyed.emplace_back(sort_key(attribute ? attr_path(x, *attribute) : x, cs), x);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& p, const auto& q) {
    return reverse ? less(q.first, p.first) : less(p.first, q.first);
  });
  std::vector<Value> out;
  for (auto& kv : keyed) out.push_back(kv.second);
  return Value::make_list(std::move(out));
}

std::string indent(const std::string& s, const Args& a) {
  const Value* w = a.get("width", 0);
  std::string unit = !w ? "    "
                     : w->is_string()
                         ? w->s
                         : std::string(static_cast<size_t>(std::max<int64_t>(0, checked_width(w->i))), ' ');
  bool first = flag(a, "first", 1, false), blank = flag(a, "blank", 2, false);
  std::string with_nl = s;
  with_nl += '\n';  // Jinja's quirk so that splitlines keeps a trailing empty line's effect
  std::vector<std::string> lines = py_splitlines(with_nl, false);
  std::string rv;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k) {
      rv += '\n';
      if (blank || !lines[k].empty()) rv += unit;
      KILN_CHECK(rv.size() <= kMaxTemplateString, "indent result exceeds {} bytes", kMaxTemplateString);
    }
    rv += lines[k];
  }
  if (first) rv.insert(0, unit);
  return rv;
}

double py_round(double x, int64_t ndigits) {
  // Python's round() is correctly rounded (ties to even on the exact binary value), which is
  // what glibc's printf does too.
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::max<int64_t>(0, ndigits)), x);
  return std::strtod(buf, nullptr);
}

}  // namespace

bool is_known_filter(const std::string& name) {
  static const std::set<std::string> names = {
      "tojson",     "safe",       "string", "default",     "d",      "length", "count",   "trim",  "lower",
      "upper",      "capitalize", "title",  "replace",     "join",   "first",  "last",    "list",  "items",
      "selectattr", "rejectattr", "select", "reject",      "map",    "indent", "reverse", "sort",  "dictsort",
      "unique",     "min",        "max",    "sum",         "abs",    "int",    "float",   "round", "center",
      "wordcount",  "escape",     "e",      "forceescape", "format", "batch",  "attr"};
  return names.count(name) > 0;
}

Value apply_filter(Interpreter& in, const std::string& name, const Value& v, const Args& a) {
  if (name == "tojson") {
    JsonOptions o;
    o.ensure_ascii = flag(a, "ensure_ascii", 0, false);
    if (const Value* ind = opt(a, "indent", 1))
      o.indent = ind->is_string() ? ind->s
                                  : std::string(static_cast<size_t>(std::max<int64_t>(0, checked_width(ind->i))), ' ');
    if (const Value* sep = opt(a, "separators", 2)) {
      KILN_CHECK(sep->is_list() && sep->list->items.size() == 2, "tojson separators must be a pair");
      o.item_sep = py_str(sep->list->items[0]);
      o.key_sep = py_str(sep->list->items[1]);
    }
    o.sort_keys = flag(a, "sort_keys", 3, false);
    return Value::string(json_dumps(v, o));
  }
  if (name == "safe" || name == "string") return name == "safe" ? v : Value::string(py_str(v));
  if (name == "default" || name == "d") {
    bool boolean = flag(a, "boolean", 1, false);
    if (v.is_undefined() || (boolean && !truthy(v))) {
      const Value* d = a.get("default_value", 0);
      return d ? *d : Value::string("");
    }
    return v;
  }
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value::integer(static_cast<int64_t>(tok::count_code_points(v.s)));
    if (v.is_list()) return Value::integer(static_cast<int64_t>(v.list->items.size()));
    if (v.is_dict()) return Value::integer(static_cast<int64_t>(v.dict->items.size()));
    if (v.is_undefined()) return Value::integer(0);
    fail("object of type '{}' has no len()", type_name(v));
  }
  if (v.is_undefined() && name != "list" && name != "join" && name != "items" && name != "first" && name != "last")
    undefined_error(v);
  if (name == "trim") return Value::string(py_strip(py_str(v), opt(a, "chars", 0), true, true));
  if (name == "lower") return Value::string(tok::lower(py_str(v)));
  if (name == "upper") return Value::string(tok::upper(py_str(v)));
  if (name == "capitalize") return Value::string(py_capitalize(py_str(v)));
  if (name == "title") {
    // Jinja splits words at whitespace and ([{< and dashes, then capitalises each.
    std::string s = py_str(v), out, word;
    auto flush = [&] {
      if (!word.empty()) out += py_capitalize(word);
      word.clear();
    };
    for (size_t i = 0; i < s.size();) {
      size_t b = i;
      char32_t c = tok::next_code_point(s, i);
      if (tok::is_python_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
        flush();
        out.append(s, b, i - b);
      } else {
        word.append(s, b, i - b);
      }
    }
    flush();
    return Value::string(out);
  }
  if (name == "replace") {
    const Value* count = opt(a, "count", 2);
    KILN_CHECK(a.pos.size() >= 2, "replace needs old and new");
    return Value::string(py_replace(py_str(v), py_str(a.pos[0]), py_str(a.pos[1]), count ? count->i : -1));
  }
  if (name == "join") {
    const Value* sep = a.get("d", 0);
    const Value* attribute = opt(a, "attribute", 1);
    std::string out;
    bool first = true;
    for (const Value& x : iterate(v)) {
      if (!first) out += sep ? py_str(*sep) : "";
      out += py_str(attribute ? attr_path(x, *attribute) : x);
      first = false;
    }
    return Value::string(out);
  }
  if (name == "first" || name == "last") {
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::make_list(iterate(v));
  if (name == "items") {
    std::vector<Value> out;
    if (v.is_undefined()) return Value::make_list();
    KILN_CHECK(v.is_dict(), "items filter needs a mapping, not {}", type_name(v));
    for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_list({k, x}, true));
    return Value::make_list(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr") return select(in, v, a, true, name == "selectattr");
  if (name == "select" || name == "reject") return select(in, v, a, false, name == "select");
  if (name == "map") return map_filter(in, v, a);
  if (name == "indent") return Value::string(indent(py_str(v), a));
  if (name == "reverse") {
    if (v.is_string()) {
      std::u32string u = tok::to_u32(v.s);
      std::reverse(u.begin(), u.end());
      return Value::string(tok::from_u32(u));
    }
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (name == "sort") return sorted(v, a);
  if (name == "dictsort") {
    KILN_CHECK(v.is_dict(), "dictsort needs a mapping");
    bool cs = flag(a, "case_sensitive", 0, false), by_value = false, reverse = flag(a, "reverse", 2, false);
    if (const Value* by = opt(a, "by", 1)) by_value = py_str(*by) == "value";
    std::vector<Value> pairs;
    for (const auto& [k, x] : v.dict->items) pairs.push_back(Value::make_list({k, x}, true));
    std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& p, const Value& q) {
      const Value& x = p.list->items[by_value ? 1 : 0];
      const Value& y = q.list->items[by_value ? 1 : 0];
      return reverse ? less(sort_key(y, cs), sort_key(x, cs)) : less(sort_key(x, cs), sort_key(y, cs));
    });
    return Value::make_list(std::move(pairs));
  }
  if (name == "unique") {
    bool cs = flag(a, "case_sensitive", 0, false);
    const Value* attribute = opt(a, "attribute", 1);
    std::vector<Value> out, seen;
    for (const Value& x : iterate(v)) {
      Value key = sort_key(attribute ? attr_path(x, *attribute) : x, cs);
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) {
        seen.push_back(key);
        out.push_back(x);
      }
    }
    return Value::make_list(std::move(out));
  }
  if (name == "min" || name == "max") {
    bool cs = flag(a, "case_sensitive", 0, false);
    const Value* attribute = opt(a, "attribute", 1);
    std::vector<Value> items = iterate(v);
    if (items.empty()) return Value::undefined(name);
    size_t best = 0;
    for (size_t k = 1; k < items.size(); ++k) {
      Value x = sort_key(attribute ? attr_path(items[k], *attribute) : items[k], cs);
      Value b = sort_key(attribute ? attr_path(items[best], *attribute) : items[best], cs);
      if (name == "min" ? less(x, b) : less(b, x)) best = k;
    }
    return items[best];
  }
  if (name == "sum") {
    const Value* attribute = opt(a, "attribute", 0);
    const Value* start = a.get("start", 1);
    Value total = start ? *start : Value::integer(0);
    for (const Value& x : iterate(v)) {
      Value y = attribute ? attr_path(x, *attribute) : x;
      KILN_CHECK(total.is_number() && y.is_number(), "sum needs numbers");
      total = total.type == T::Float || y.type == T::Float
                  ? Value::number(total.as_double() + y.as_double())
                  : Value::integer(static_cast<int64_t>(total.as_double()) + static_cast<int64_t>(y.as_double()));
    }
    return total;
  }
  if (name == "abs") {
    KILN_CHECK(v.is_number(), "bad operand type for abs(): '{}'", type_name(v));
    return v.type == T::Float ? Value::number(std::fabs(v.f))
                              : Value::integer(std::llabs(v.type == T::Bool ? v.b : v.i));
  }
  if (name == "int") {
    const Value* d = a.get("default", 0);
    Value dflt = d ? *d : Value::integer(0);
    if (v.type == T::Int) return v;
    if (v.type == T::Bool) return Value::integer(v.b);
    if (v.type == T::Float) return std::isfinite(v.f) ? Value::integer(static_cast<int64_t>(v.f)) : dflt;
    if (v.is_string()) {
      try {
        size_t used = 0;
        std::string s = py_strip(v.s, nullptr, true, true);
        int64_t r = std::stoll(s, &used, 10);
        if (used == s.size()) return Value::integer(r);
        double f = std::stod(s, &used);
        if (used == s.size()) return Value::integer(static_cast<int64_t>(f));
      } catch (const std::exception&) {
      }
    }
    return dflt;
  }
  if (name == "float") {
    const Value* d = a.get("default", 0);
    if (v.is_number()) return Value::number(v.as_double());
    if (v.is_string()) {
      try {
        size_t used = 0;
        std::string s = py_strip(v.s, nullptr, true, true);
        double f = std::stod(s, &used);
        if (used == s.size()) return Value::number(f);
      } catch (const std::exception&) {
      }
    }
    return d ? *d : Value::number(0.0);
  }
  if (name == "round") {
    int64_t precision = 0;
    if (const Value* p = opt(a, "precision", 0)) precision = p->i;
    std::string method = "common";
    if (const Value* m = opt(a, "method", 1)) method = py_str(*m);
    KILN_CHECK(v.is_number(), "round needs a number, not {}", type_name(v));
    double x = v.as_double(), scale = std::pow(10.0, static_cast<double>(precision));
    if (method == "ceil") return Value::number(std::ceil(x * scale) / scale);
    if (method == "floor") return Value::number(std::floor(x * scale) / scale);
    KILN_CHECK(method == "common", "round method must be common, ceil or floor");
    if (v.type != T::Float) return Value::integer(v.type == T::Bool ? v.b : v.i);  // Python keeps ints
    return Value::number(precision >= 0 ? py_round(x, precision) : std::round(x * scale) / scale);
  }
  if (name == "center") {
    int64_t width = 80;
    if (const Value* w = opt(a, "width", 0)) width = checked_width(w->i);
    std::string s = py_str(v);
    int64_t n = static_cast<int64_t>(tok::count_code_points(s));
    if (width <= n) return Value::string(s);
    int64_t total = width - n, left = total / 2 + (total & width & 1);
    std::string out(static_cast<size_t>(left), ' ');
    out += s;
    out.append(static_cast<size_t>(total - left), ' ');
    return Value::string(out);
  }
  if (name == "wordcount") return Value::integer(static_cast<int64_t>(py_split(py_str(v), nullptr, -1).size()));
  if (name == "escape" || name == "e" || name == "forceescape") {
    std::string out;
    for (char c : py_str(v)) {
      switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += c;
      }
    }
    return Value::string(out);
  }
  if (name == "format") {
    // Jinja's format filter is Python's printf-style `value % args`.
    if (!a.kw.empty()) {
      Value d = Value::make_dict();
      for (const auto& [k, x] : a.kw) d.dict->set(Value::string(k), x);
      return Value::string(percent_format(py_str(v), d));
    }
    return Value::string(percent_format(py_str(v), Value::make_list(a.pos, true)));
  }
  if (name == "batch") {
    KILN_CHECK(!a.pos.empty(), "batch needs a size");
    int64_t n = a.pos[0].i;
    KILN_CHECK(n > 0, "batch size must be positive");
    const Value* fill = opt(a, "fill_with", 1);
    std::vector<Value> out, cur;
    for (const Value& x : iterate(v)) {
      cur.push_back(x);
      if (static_cast<int64_t>(cur.size()) == n) {
        out.push_back(Value::make_list(std::move(cur)));
        cur.clear();
      }
    }
    if (!cur.empty()) {
      while (fill && static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
      out.push_back(Value::make_list(std::move(cur)));
    }
    return Value::make_list(std::move(out));
  }
  if (name == "attr") {
    KILN_CHECK(!a.pos.empty(), "attr needs a name");
    return get_attr(v, py_str(a.pos[0]));
  }
  fail("no filter named '{}'", name);
}

}  // namespace kiln::jinja

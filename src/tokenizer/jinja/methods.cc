#include "tokenizer/jinja/methods.h"

#include <charconv>
#include <set>

#include "core/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/unicode.h"

namespace kiln::jinja {

using tok::from_u32;
using tok::is_python_space;
using tok::to_u32;

namespace {

const Value* arg(const Args& a, const char* name, size_t i) {
  const Value* v = a.get(name, i);
  return v && !v->is_none() ? v : nullptr;
}

const std::string& str_arg(const Args& a, const char* name, size_t i, const char* method) {
  const Value* v = a.get(name, i);
  KILN_CHECK(v && v->is_string(), "str.{}() argument '{}' must be a string", method, name);
  return v->s;
}

int64_t int_arg(const Args& a, const char* name, size_t i, int64_t dflt) {
  const Value* v = arg(a, name, i);
  if (!v) return dflt;
  KILN_CHECK(v->type == Value::Type::Int || v->type == Value::Type::Bool, "argument '{}' must be an integer", name);
  return v->type == Value::Type::Bool ? v->b : v->i;
}

Value str_list(const std::vector<std::string>& parts) {
  std::vector<Value> items;
  for (const auto& p : parts) items.push_back(Value::string(p));
  return Value::make_list(std::move(items));
}

// Code-point index of byte offset b in s.
int64_t cp_index(const std::string& s, size_t b) {
  return static_cast<int64_t>(tok::count_code_points(std::string_view(s).substr(0, b)));
}

bool matches_any(const std::string& s, const Value& prefixes, bool at_start) {
  auto one = [&](const std::string& p) {
    if (p.size() > s.size()) return false;
    return at_start ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
  };
  if (prefixes.is_string()) return one(prefixes.s);
  KILN_CHECK(prefixes.is_list(), "startswith/endswith first arg must be str or a tuple of str");
  for (const Value& p : prefixes.list->items) {
    KILN_CHECK(p.is_string(), "startswith/endswith tuple must hold strings");
    if (one(p.s)) return true;
  }
  return false;
}

std::string pad(const std::string& s, int64_t width, const std::string& fill, int where) {
  int64_t n = static_cast<int64_t>(tok::count_code_points(s));
  if (width <= n) return s;
  int64_t total = width - n;
  int64_t left = where < 0 ? 0 : where > 0 ? total : total / 2 + (total & width & 1);
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = 0; k < total - left; ++k) out += fill;
  return out;
}

// str.format with automatic ({}), numbered ({0}) and named ({name}) fields; no format specs.
std::string str_format(const std::string& f, const Args& a) {
  std::string out;
  size_t auto_idx = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    char c = f[i];
    if ((c == '{' || c == '}') && i + 1 < f.size() && f[i + 1] == c) {
      out += c;
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    size_t e = f.find('}', i);
    KILN_CHECK(e != std::string::npos, "Single '{{' encountered in format string");
    std::string field = f.substr(i + 1, e - i - 1);
    KILN_CHECK(field.find(':') == std::string::npos && field.find('!') == std::string::npos,
               "str.format: format specs and conversions are not supported");
    const Value* v;
    if (field.empty()) {
      v = auto_idx < a.pos.size() ? &a.pos[auto_idx++] : nullptr;
    } else if (std::isdigit(static_cast<unsigned char>(field[0]))) {
      size_t idx = 0;
      auto r = std::from_chars(field.data(), field.data() + field.size(), idx);
      KILN_CHECK(r.ec == std::errc() && r.ptr == field.data() + field.size(), "str.format: bad field {{{}}}", field);
      v = idx < a.pos.size() ? &a.pos[idx] : nullptr;
    } else {
      v = nullptr;
      for (const auto& [k, x] : a.kw)
        if (k == field) v = &x;
    }
    KILN_CHECK(v, "str.format: no value for field {{{}}}", field);
    out += py_str(*v);
    i = e;
  }
  return out;
}

Value string_method(const std::string& s, const std::string& name) {
  using Fn = std::function<Value(const Args&)>;
  Fn f;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    f = [s, l, r](const Args& a) { return Value::string(py_strip(s, arg(a, "chars", 0), l, r)); };
  } else if (name == "split" || name == "rsplit") {
    bool rev = name == "rsplit";
    f = [s, rev](const Args& a) {
      int64_t maxsplit = int_arg(a, "maxsplit", 1, -1);
      if (!rev) return str_list(py_split(s, arg(a, "sep", 0), maxsplit));
      // rsplit: split the reversed string with the reversed separator, then reverse back.
      std::u32string rs = to_u32(s);
      std::reverse(rs.begin(), rs.end());
      const Value* sep = arg(a, "sep", 0);
      Value rsep;
      if (sep) {
        std::u32string x = to_u32(sep->s);
        std::reverse(x.begin(), x.end());
        rsep = Value::string(from_u32(x));
      }
      auto parts = py_split(from_u32(rs), sep ? &rsep : nullptr, maxsplit);
      std::reverse(parts.begin(), parts.end());
      for (auto& p : parts) {
        std::u32string x = to_u32(p);
        std::reverse(x.begin(), x.end());
        p = from_u32(x);
      }
      return str_list(parts);
    };
  } else if (name == "splitlines") {
    f = [s](const Args& a) {
      const Value* k = arg(a, "keepends", 0);
      return str_list(py_splitlines(s, k && truthy(*k)));
    };
  } else if (name == "startswith" || name == "endswith") {
    bool start = name == "startswith";
    f = [s, start](const Args& a) {
      KILN_CHECK(!a.pos.empty(), "{}() takes at least 1 argument", start ? "startswith" : "endswith");
      return Value::boolean(matches_any(s, a.pos[0], start));
    };
  } else if (name == "replace") {
    f = [s](const Args& a) {
      return Value::string(
          py_replace(s, str_arg(a, "old", 0, "replace"), str_arg(a, "new", 1, "replace"), int_arg(a, "count", 2, -1)));
    };
  } else if (name == "upper" || name == "lower" || name == "casefold") {
    bool up = name == "upper";
    f = [s, up](const Args&) { return Value::string(up ? tok::upper(s) : tok::lower(s)); };
  } else if (name == "capitalize") {
    f = [s](const Args&) { return Value::string(py_capitalize(s)); };
  } else if (name == "title") {
    f = [s](const Args&) {
      std::string out;
      bool prev_cased = false;
      for (size_t i = 0; i < s.size();) {
        char32_t c = tok::next_code_point(s, i);
        bool cased = tok::is_upper(c) || tok::is_lower(c);
        tok::append_utf8(out, cased ? (prev_cased ? tok::to_lower(c) : tok::to_upper(c)) : c);
        prev_cased = cased;
      }
      return Value::string(out);
    };
  } else if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    f = [s, name](const Args& a) {
      const std::string& sub = str_arg(a, "sub", 0, name.c_str());
      if (name == "count") {
        if (sub.empty()) return Value::integer(static_cast<int64_t>(tok::count_code_points(s)) + 1);
        int64_t n = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
        return Value::integer(n);
      }
      size_t p = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
      if (p == std::string::npos) {
        KILN_CHECK(name.find("index") == std::string::npos, "substring not found");
        return Value::integer(-1);
      }
      return Value::integer(cp_index(s, p));
    };
  } else if (name == "join") {
    f = [s](const Args& a) {
      KILN_CHECK(!a.pos.empty(), "join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (const Value& v : iterate(a.pos[0])) {
        KILN_CHECK(v.is_string(), "sequence item: expected str instance, {} found", type_name(v));
        if (!first) out += s;
        out += v.s;
        first = false;
      }
      return Value::string(out);
    };
  } else if (name == "format") {
    f = [s](const Args& a) { return Value::string(str_format(s, a)); };
  } else if (name == "isdigit" || name == "isnumeric" || name == "isdecimal" || name == "isalpha" ||
             name == "isalnum" || name == "isspace" || name == "isupper" || name == "islower") {
    f = [s, name](const Args&) {
      std::u32string u = to_u32(s);
      if (u.empty()) return Value::boolean(false);
      bool any_cased = false;
      for (char32_t c : u) {
        bool ok;
        if (name == "isalpha") {
          ok = tok::is_alpha(c);
        } else if (name == "isalnum") {
          ok = tok::is_alphanumeric(c);
        } else if (name == "isspace") {
          ok = is_python_space(c);
        } else if (name == "isupper" || name == "islower") {
          bool up = tok::is_upper(c), low = tok::is_lower(c);
          any_cased |= up || low;
          ok = name == "isupper" ? !low : !up;
        } else {
          ok = tok::is_digit(c);
        }
        if (!ok) return Value::boolean(false);
      }
      return Value::boolean(name == "isupper" || name == "islower" ? any_cased : true);
    };
  } else if (name == "zfill" || name == "center" || name == "ljust" || name == "rjust") {
    f = [s, name](const Args& a) {
      int64_t width = checked_width(int_arg(a, "width", 0, 0));
      if (name == "zfill") {
        size_t sign = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
        int64_t n = static_cast<int64_t>(tok::count_code_points(s));
        if (width <= n) return Value::string(s);
        return Value::string(s.substr(0, sign) + std::string(static_cast<size_t>(width - n), '0') + s.substr(sign));
      }
      const Value* fill = arg(a, "fillchar", 1);
      std::string fc = fill ? fill->s : " ";
      KILN_CHECK(tok::count_code_points(fc) == 1, "{}: the fill character must be exactly one character long", name);
      return Value::string(pad(s, width, fc, name == "center" ? 0 : name == "ljust" ? -1 : 1));
    };
  } else if (name == "partition" || name == "rpartition") {
    bool rev = name == "rpartition";
    f = [s, rev](const Args& a) {
      const std::string& sep = str_arg(a, "sep", 0, "partition");
      KILN_CHECK(!sep.empty(), "empty separator");
      size_t p = rev ? s.rfind(sep) : s.find(sep);
      std::vector<Value> parts;
      if (p == std::string::npos) {
        parts = rev ? std::vector<Value>{Value::string(""), Value::string(""), Value::string(s)}
                    : std::vector<Value>{Value::string(s), Value::string(""), Value::string("")};
      } else {
        parts = {Value::string(s.substr(0, p)), Value::string(sep), Value::string(s.substr(p + sep.size()))};
      }
      return Value::make_list(std::move(parts), true);
    };
  } else if (name == "removeprefix" || name == "removesuffix") {
    bool pre = name == "removeprefix";
    f = [s, pre](const Args& a) {
      const std::string& x = str_arg(a, "affix", 0, pre ? "removeprefix" : "removesuffix");
      if (pre && s.compare(0, x.size(), x) == 0) return Value::string(s.substr(x.size()));
      if (!pre && x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0)
        return Value::string(s.substr(0, s.size() - x.size()));
      return Value::string(s);
    };
  } else {
    return Value::undefined(name);
  }
  return Value::function("str." + name, [f](Interpreter&, const Args& a) { return f(a); });
}

}  // namespace

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::u32string u = to_u32(s);
  std::u32string set = chars ? to_u32(chars->s) : U"";
  auto strip_it = [&](char32_t c) { return chars ? set.find(c) != std::u32string::npos : is_python_space(c); };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return from_u32(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    KILN_CHECK(sep->is_string(), "split() separator must be a string");
    KILN_CHECK(!sep->s.empty(), "empty separator");
    size_t pos = 0;
    for (size_t f; (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) &&
                   (f = s.find(sep->s, pos)) != std::string::npos;
         pos = f + sep->s.size())
      out.push_back(s.substr(pos, f - pos));
    out.push_back(s.substr(pos));
    return out;
  }
  std::u32string u = to_u32(s);
  size_t i = 0;
  while (i < u.size()) {
    while (i < u.size() && is_python_space(u[i])) ++i;
    if (i >= u.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
      size_t e = u.size();
      while (e > i && is_python_space(u[e - 1])) --e;
      out.push_back(from_u32(std::u32string_view(u).substr(i, e - i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !is_python_space(u[j])) ++j;
    out.push_back(from_u32(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return out;
}

std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
  std::vector<std::string> out;
  std::u32string u = to_u32(s);
  size_t start = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    if (!tok::is_python_linebreak(u[i])) continue;
    size_t eol = i;
    if (u[i] == '\r' && i + 1 < u.size() && u[i + 1] == '\n') ++i;
    out.push_back(from_u32(std::u32string_view(u).substr(start, (keepends ? i + 1 : eol) - start)));
    start = i + 1;
  }
  if (start < u.size()) out.push_back(from_u32(std::u32string_view(u).substr(start)));
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::u32string u = to_u32(s);
  for (size_t k = 0; k < u.size(); ++k) u[k] = k == 0 ? tok::to_upper(u[k]) : tok::to_lower(u[k]);
  return from_u32(u);
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `rep` before every character and at the end.
    std::u32string u = to_u32(s);
    int64_t n = 0;
    for (char32_t c : u) {
      if (count < 0 || n < count) {
        out += rep;
        ++n;
      }
      tok::append_utf8(out, c);
    }
    if (count < 0 || n < count) out += rep;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  for (size_t f; (count < 0 || n < count) && (f = s.find(old, pos)) != std::string::npos; pos = f + old.size(), ++n) {
    out.append(s, pos, f - pos);
    out += rep;
  }
  out.append(s, pos);
  return out;
}

// Python's printf-style `str % args`, for %s, %r, %d, %i, %f and %%.
std::string percent_format(const std::string& f, const Value& args) {
  auto as_int = [](const Value& v) { return v.type == Value::Type::Bool ? int64_t{v.b} : v.i; };
  std::vector<Value> items = args.is_list() && args.list->tuple ? args.list->items : std::vector<Value>{args};
  std::string out;
  size_t k = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    KILN_CHECK(i + 1 < f.size(), "incomplete format");
    char c = f[++i];
    if (c == '%') {
      out += '%';
      continue;
    }
    KILN_CHECK(k < items.size(), "not enough arguments for format string");
    const Value& a = items[k++];
    if (c == 's') {
      out += py_str(a);
    } else if (c == 'r') {
      out += py_repr(a);
    } else if (c == 'd' || c == 'i') {
      KILN_CHECK(a.is_number(), "%{} format: a number is required, not {}", c, type_name(a));
      out += std::to_string(a.type == Value::Type::Float ? static_cast<int64_t>(a.f) : as_int(a));
    } else if (c == 'f') {
      KILN_CHECK(a.is_number(), "%f format: a number is required, not {}", type_name(a));
      out += fmt::format("{:.6f}", a.as_double());
    } else {
      fail("unsupported format character '{}'", c);
    }
  }
  KILN_CHECK(k == items.size(), "not all arguments converted during string formatting");
  return out;
}

Value method(const Value& obj, const std::string& name) {
  if (obj.is_string()) return string_method(obj.s, name);
  static const std::set<std::string> unsafe = {"append", "clear",  "extend", "insert",     "pop",    "popitem",
                                               "remove", "update", "sort",   "setdefault", "reverse"};
  if ((obj.is_list() || (obj.is_dict() && obj.dict->kind == Dict::Kind::Dict)) && unsafe.count(name)) {
    std::string tn = type_name(obj);
    return Value::function(name, [tn, name](Interpreter&, const Args&) -> Value {
      fail("access to attribute '{}' of '{}' object is unsafe (templates cannot modify lists or dicts)", name, tn);
    });
  }
  if (obj.is_dict() && obj.dict->kind == Dict::Kind::Dict) {
    std::shared_ptr<Dict> d = obj.dict;
    if (name == "items" || name == "keys" || name == "values") {
      return Value::function(name, [d, name](Interpreter&, const Args&) {
        std::vector<Value> out;
        for (const auto& [k, v] : d->items) {
          if (name == "items") {
            out.push_back(Value::make_list({k, v}, true));
          } else {
            out.push_back(name == "keys" ? k : v);
          }
        }
        return Value::make_list(std::move(out));
      });
    }
    if (name == "get") {
      return Value::function(name, [d](Interpreter&, const Args& a) {
        KILN_CHECK(!a.pos.empty(), "get() needs a key");
        const Value* v = d->find(a.pos[0]);
        if (v) return *v;
        return a.pos.size() > 1 ? a.pos[1] : Value::none();
      });
    }
    if (name == "copy") {
      return Value::function(name, [d](Interpreter&, const Args&) {
        Value c = Value::make_dict();
        c.dict->items = d->items;
        return c;
      });
    }
  }
  if (obj.is_list() && (name == "index" || name == "count")) {
    std::shared_ptr<List> l = obj.list;
    return Value::function(name, [l, name](Interpreter&, const Args& a) {
      KILN_CHECK(!a.pos.empty(), "{}() takes one argument", name);
      int64_t n = 0;
      for (size_t k = 0; k < l->items.size(); ++k) {
        if (!equals(l->items[k], a.pos[0])) continue;
        if (name == "index") return Value::integer(static_cast<int64_t>(k));
        ++n;
      }
      KILN_CHECK(name == "count", "{} is not in list", py_repr(a.pos[0]));
      return Value::integer(n);
    });
  }
  return Value::undefined(name);
}

}  // namespace kiln::jinja

// Attribute and item access, iteration, tests and globals. Filters are in filters.cc.
#include <chrono>
#include <cmath>
#include <ctime>
#include <set>

#include "core/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/methods.h"
#include "tokenizer/unicode.h"

namespace kiln::jinja {

void undefined_error(const Value& u) {
  if (u.s.empty()) fail("a value is undefined");
  fail("'{}' is undefined", u.s);
}

std::vector<Value> iterate(const Value& v) {
  // One Value per item: cap the size so that iterating a huge string cannot exhaust memory.
  KILN_CHECK(!v.is_string() || v.s.size() <= (1u << 20), "string of {} bytes is too long to iterate", v.s.size());
  switch (v.type) {
    case Value::Type::Undefined: return {};
    case Value::Type::List: return v.list->items;
    case Value::Type::Dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Type::String: {
      std::vector<Value> chars;
      for (size_t i = 0; i < v.s.size();) {
        size_t b = i;
        tok::next_code_point(v.s, i);
        chars.push_back(Value::string(v.s.substr(b, i - b)));
      }
      return chars;
    }
    default: fail("'{}' object is not iterable", type_name(v));
  }
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) fail("'{}' is undefined (reading its attribute '{}')", obj.s.empty() ? "value" : obj.s, name);
  if (obj.is_dict() && obj.dict->kind != Dict::Kind::Dict) {
    const Value* v = obj.dict->find(name);
    return v ? *v : Value::undefined(name);
  }
  Value m = method(obj, name);
  if (!m.is_undefined()) return m;
  if (obj.is_dict()) {
    const Value* v = obj.dict->find(name);
    if (v) return *v;
  }
  return Value::undefined(name);
}

namespace {

// Python index normalisation; false when out of range.
bool norm_index(int64_t i, size_t n, size_t& out) {
  if (i < 0) i += static_cast<int64_t>(n);
  if (i < 0 || i >= static_cast<int64_t>(n)) return false;
  out = static_cast<size_t>(i);
  return true;
}

}  // namespace

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) fail("'{}' is undefined (reading item {})", obj.s.empty() ? "value" : obj.s, py_repr(key));
  if (obj.is_dict()) {
    const Value* v = obj.dict->find(key);
    if (v) return *v;
  } else if ((obj.is_list() || obj.is_string()) && key.is_number() && key.type != Value::Type::Float) {
    int64_t i = key.type == Value::Type::Bool ? key.b : key.i;
    size_t idx;
    if (obj.is_list()) {
      if (norm_index(i, obj.list->items.size(), idx)) return obj.list->items[idx];
    } else {
      std::u32string u = tok::to_u32(obj.s);
      if (norm_index(i, u.size(), idx)) return Value::string(tok::to_utf8(u[idx]));
    }
    return Value::undefined(py_repr(key));
  }
  if (key.is_string()) return get_attr(obj, key.s);
  return Value::undefined(py_repr(key));
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) undefined_error(obj);
  auto as_opt = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    KILN_CHECK(v.is_number() && v.type != Value::Type::Float, "slice {} must be an integer or None", what);
    return v.type == Value::Type::Bool ? v.b : v.i;
  };
  int64_t st = as_opt(step, "step").value_or(1);
  KILN_CHECK(st != 0, "slice step cannot be zero");
  std::u32string chars;
  int64_t n;
  if (obj.is_string()) {
    chars = tok::to_u32(obj.s);
    n = static_cast<int64_t>(chars.size());
  } else {
    KILN_CHECK(obj.is_list(), "'{}' object is not subscriptable", type_name(obj));
    n = static_cast<int64_t>(obj.list->items.size());
  }
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, bool is_start) {
    if (!v) return st > 0 ? (is_start ? int64_t{0} : n) : (is_start ? n - 1 : int64_t{-1});
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  int64_t b = adjust(as_opt(start, "start"), true), e = adjust(as_opt(stop, "stop"), false);
  std::vector<int64_t> idx;
  for (int64_t k = b; st > 0 ? k < e : k > e; k += st) idx.push_back(k);
  if (obj.is_string()) {
    std::u32string out;
    for (int64_t k : idx) out += chars[static_cast<size_t>(k)];
    return Value::string(tok::from_u32(out));
  }
  std::vector<Value> items;
  for (int64_t k : idx) items.push_back(obj.list->items[static_cast<size_t>(k)]);
  return Value::make_list(std::move(items), obj.list->tuple);
}

bool is_known_test(const std::string& name) {
  static const std::set<std::string> names = {
      "defined", "undefined", "none",        "boolean",     "true",     "false",    "integer",  "float",
      "number",  "string",    "mapping",     "iterable",    "sequence", "callable", "escaped",  "sameas",
      "eq",      "equalto",   "==",          "ne",          "!=",       "lt",       "lessthan", "<",
      "le",      "<=",        "gt",          "greaterthan", ">",        "ge",       ">=",       "in",
      "odd",     "even",      "divisibleby", "lower",       "upper"};
  return names.count(name) > 0;
}

bool apply_test(Interpreter& in, const std::string& name, const Value& v, const Args& args) {
  auto arg0 = [&]() -> const Value& {
    KILN_CHECK(!args.pos.empty(), "test '{}' needs an argument", name);
    return args.pos[0];
  };
  using T = Value::Type;
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.type == T::Bool;
  if (name == "true") return v.type == T::Bool && v.b;
  if (name == "false") return v.type == T::Bool && !v.b;
  if (name == "integer") return v.type == T::Int;
  if (name == "float") return v.type == T::Float;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && v.dict->kind == Dict::Kind::Dict;
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || (v.is_dict() && v.dict->kind == Dict::Kind::Dict);
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "sameas") {
    const Value& o = arg0();
    if (v.type != o.type) return false;
    if (v.is_list()) return v.list == o.list;
    if (v.is_dict()) return v.dict == o.dict;
    return equals(v, o);
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, arg0());
  if (name == "ne" || name == "!=") return !equals(v, arg0());
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, arg0());
  if (name == "le" || name == "<=") return !less(arg0(), v);
  if (name == "gt" || name == "greaterthan" || name == ">") return less(arg0(), v);
  if (name == "ge" || name == ">=") return !less(v, arg0());
  if (name == "in") {
    const Value& c = arg0();
    if (c.is_string()) {
      KILN_CHECK(v.is_string(), "'in <string>' requires string as left operand, not {}", type_name(v));
      return c.s.find(v.s) != std::string::npos;
    }
    if (c.is_dict()) return c.dict->find(v) != nullptr;
    for (const Value& x : iterate(c))
      if (equals(x, v)) return true;
    return false;
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    KILN_CHECK(v.type == T::Int || v.type == T::Bool, "test '{}' needs an integer", name);
    int64_t x = v.type == T::Bool ? v.b : v.i;
    if (name == "divisibleby") {
      const Value& d = arg0();
      KILN_CHECK(d.type == T::Int && d.i != 0, "divisibleby needs a non-zero integer");
      return x % d.i == 0;
    }
    return (((x % 2) + 2) % 2 == 1) == (name == "odd");
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    return name == "lower" ? tok::lower(v.s) == v.s : tok::upper(v.s) == v.s;
  }
  (void)in;
  fail("no test named '{}'", name);
}

void add_globals(std::unordered_map<std::string, Value>& vars) {
  vars["range"] = Value::function("range", [](Interpreter&, const Args& a) {
    KILN_CHECK(!a.pos.empty() && a.pos.size() <= 3, "range expected 1 to 3 arguments");
    for (const Value& v : a.pos)
      KILN_CHECK(v.type == Value::Type::Int || v.type == Value::Type::Bool, "range() arguments must be integers");
    auto iv = [](const Value& v) { return v.type == Value::Type::Bool ? int64_t{v.b} : v.i; };
    int64_t start = a.pos.size() == 1 ? 0 : iv(a.pos[0]);
    int64_t stop = a.pos.size() == 1 ? iv(a.pos[0]) : iv(a.pos[1]);
    int64_t step = a.pos.size() == 3 ? iv(a.pos[2]) : 1;
    KILN_CHECK(step != 0, "range() arg 3 must not be zero");
    std::vector<Value> items;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      KILN_CHECK(items.size() < 100000, "range too big (more than 100000 items)");  // the sandbox's MAX_RANGE
      items.push_back(Value::integer(k));
    }
    return Value::make_list(std::move(items));
  });
  vars["namespace"] = Value::function("namespace", [](Interpreter& in, const Args& a) {
    Value ns = Value::make_dict(Dict::Kind::Namespace);
    in.track_namespace(ns.dict);
    for (const Value& p : a.pos) {
      KILN_CHECK(p.is_dict(), "namespace() positional arguments must be dicts");
      for (const auto& [k, v] : p.dict->items) ns.dict->set(k, v);
    }
    for (const auto& [k, v] : a.kw) ns.dict->set(Value::string(k), v);
    return ns;
  });
  vars["dict"] = Value::function("dict", [](Interpreter&, const Args& a) {
    Value d = Value::make_dict();
    for (const Value& p : a.pos) {
      KILN_CHECK(p.is_dict(), "dict() positional argument must be a dict");
      for (const auto& [k, v] : p.dict->items) d.dict->set(k, v);
    }
    for (const auto& [k, v] : a.kw) d.dict->set(Value::string(k), v);
    return d;
  });
  vars["raise_exception"] = Value::function("raise_exception", [](Interpreter&, const Args& a) -> Value {
    fail("raise_exception: {}", a.pos.empty() ? std::string() : py_str(a.pos[0]));
  });
  vars["strftime_now"] = Value::function("strftime_now", [](Interpreter&, const Args& a) {
    KILN_CHECK(!a.pos.empty() && a.pos[0].is_string(), "strftime_now() needs a format string");
    std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    size_t n = std::strftime(buf, sizeof(buf), a.pos[0].s.c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
}

}  // namespace kiln::jinja

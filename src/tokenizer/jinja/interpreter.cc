#include "tokenizer/jinja/interpreter.h"

#include <cmath>

#include "core/error.h"
#include "tokenizer/jinja/methods.h"

namespace kiln::jinja {

namespace {

// Limits that turn a runaway template (a model's files are untrusted input) into an error rather
// than a hung or crashed server. Real chat templates stay orders of magnitude below them.
constexpr int kMaxDepth = 200;                     // macro recursion
constexpr uint64_t kMaxSteps = 1'000'000;          // statements executed + loop iterations
constexpr size_t kMaxString = kMaxTemplateString;  // any string the template builds, and the output

std::string check_size(std::string s) {
  KILN_CHECK(s.size() <= kMaxString, "template output or string exceeds {} bytes", kMaxString);
  return s;
}

[[noreturn]] void type_error(const std::string& op, const Value& a, const Value& b) {
  fail("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b));
}

int64_t as_int(const Value& v) {
  return v.type == Value::Type::Bool ? (v.b ? 1 : 0) : v.i;
}

// Python ints do not overflow; int64 does, and then we stop rather than wrap.
int64_t add(int64_t a, int64_t b) {
  int64_t r;
  KILN_CHECK(!__builtin_add_overflow(a, b, &r), "integer overflow");
  return r;
}
int64_t sub(int64_t a, int64_t b) {
  int64_t r;
  KILN_CHECK(!__builtin_sub_overflow(a, b, &r), "integer overflow");
  return r;
}
int64_t mul(int64_t a, int64_t b) {
  int64_t r;
  KILN_CHECK(!__builtin_mul_overflow(a, b, &r), "integer overflow");
  return r;
}

}  // namespace

int64_t checked_width(int64_t width) {
  KILN_CHECK(width <= static_cast<int64_t>(kMaxString), "width {} is past the {}-byte limit on template strings", width,
             kMaxString);
  return width;
}

std::string Interpreter::render(const std::vector<std::pair<std::string, Value>>& vars) {
  auto globals = std::make_shared<Frame>();
  add_globals(globals->vars);
  for (const auto& [k, v] : vars) globals->vars[k] = v;
  frame_ = std::make_shared<Frame>();
  frame_->parent = globals;
  struct Cleanup {
    Interpreter& in;
    ~Cleanup() {
      for (auto& w : in.namespaces_)
        if (auto d = w.lock()) d->items.clear();
      in.namespaces_.clear();
      in.frame_.reset();
    }
  } cleanup{*this};
  std::string out;
  exec(tmpl_->body, out);
  return out;
}

Value Interpreter::lookup(const std::string& name) const {
  for (const Frame* f = frame_.get(); f; f = f->parent.get()) {
    auto it = f->vars.find(name);
    if (it != f->vars.end()) return it->second;
  }
  return Value::undefined(name);
}

void Interpreter::assign(const Target& t, Value v) {
  if (!t.attr.empty()) {
    Value ns = lookup(t.names[0]);
    KILN_CHECK(ns.is_dict() && ns.dict->kind == Dict::Kind::Namespace,
               "cannot assign attribute '{}' on '{}': it is not a namespace", t.attr, t.names[0]);
    ns.dict->set(Value::string(t.attr), std::move(v));
    return;
  }
  if (!t.tuple) {
    frame_->vars[t.names[0]] = std::move(v);
    return;
  }
  std::vector<Value> items = iterate(v);
  KILN_CHECK(items.size() == t.names.size(), "cannot unpack {} values into {} names", items.size(), t.names.size());
  for (size_t k = 0; k < items.size(); ++k) frame_->vars[t.names[k]] = items[k];
}

Args Interpreter::eval_args(const Expr& e) {
  Args a;
  for (const auto& x : e.args) a.pos.push_back(eval(*x));
  for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
  return a;
}

Value Interpreter::call(const Value& fn, const Args& args) {
  if (fn.is_undefined()) undefined_error(fn);
  KILN_CHECK(fn.is_callable(), "'{}' object is not callable", type_name(fn));
  return fn.fn->call(*this, args);
}

Value Interpreter::eval(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::Literal: return e.literal;
    case Expr::Kind::Name: return lookup(e.name);
    case Expr::Kind::List:
    case Expr::Kind::Tuple: {
      std::vector<Value> items;
      for (const auto& x : e.args) items.push_back(eval(*x));
      return Value::make_list(std::move(items), e.kind == Expr::Kind::Tuple);
    }
    case Expr::Kind::Dict: {
      Value d = Value::make_dict();
      for (size_t k = 0; k + 1 < e.args.size(); k += 2) d.dict->set(eval(*e.args[k]), eval(*e.args[k + 1]));
      return d;
    }
    case Expr::Kind::GetAttr: return get_attr(eval(*e.a), e.name);
    case Expr::Kind::GetItem: return get_item(eval(*e.a), eval(*e.b));
    case Expr::Kind::Slice: {
      Value obj = eval(*e.a);
      Value parts[3];
      for (size_t k = 0; k < 3; ++k) parts[k] = e.args[k] ? eval(*e.args[k]) : Value::none();
      return slice(obj, parts[0], parts[1], parts[2]);
    }
    case Expr::Kind::Call: {
      Value fn = eval(*e.a);
      return call(fn, eval_args(e));
    }
    case Expr::Kind::Filter: return apply_filter(*this, e.name, e.a ? eval(*e.a) : Value::undefined(), eval_args(e));
    case Expr::Kind::Test: {
      bool r = apply_test(*this, e.name, eval(*e.a), eval_args(e));
      return Value::boolean(e.negated ? !r : r);
    }
    case Expr::Kind::Neg:
    case Expr::Kind::Pos: {
      Value v = eval(*e.a);
      if (v.is_undefined()) undefined_error(v);
      KILN_CHECK(v.is_number(), "bad operand type for unary {}: '{}'", e.kind == Expr::Kind::Neg ? '-' : '+',
                 type_name(v));
      if (e.kind == Expr::Kind::Pos) return v.type == Value::Type::Float ? v : Value::integer(as_int(v));
      if (v.type == Value::Type::Float) return Value::number(-v.f);
      return Value::integer(sub(0, as_int(v)));
    }
    case Expr::Kind::Not: return Value::boolean(!truthy(eval(*e.a)));
    case Expr::Kind::And: {
      Value a = eval(*e.a);
      return truthy(a) ? eval(*e.b) : a;
    }
    case Expr::Kind::Or: {
      Value a = eval(*e.a);
      return truthy(a) ? a : eval(*e.b);
    }
    case Expr::Kind::BinOp: {
      Value a = eval(*e.a);
      Value b = eval(*e.b);
      return eval_binop(e.name, a, b);
    }
    case Expr::Kind::Concat: {
      std::string s;
      for (const auto& x : e.args) s += py_str(eval(*x));
      return Value::string(check_size(std::move(s)));
    }
    case Expr::Kind::Compare: return eval_compare(e);
    case Expr::Kind::CondExpr:
      if (truthy(eval(*e.b))) return eval(*e.a);
      return e.c ? eval(*e.c) : Value::undefined();
  }
  return Value::undefined();
}

Value Interpreter::eval_compare(const Expr& e) {
  Value left = eval(*e.a);
  for (size_t k = 0; k < e.ops.size(); ++k) {
    Value right = eval(*e.args[k]);
    const std::string& op = e.ops[k];
    bool r;
    if (op == "==") {
      r = equals(left, right);
    } else if (op == "!=") {
      r = !equals(left, right);
    } else if (op == "in" || op == "notin") {
      Args a;
      a.pos.push_back(right);
      r = apply_test(*this, "in", left, a);
      if (op == "notin") r = !r;
    } else {
      if (left.is_undefined()) undefined_error(left);
      if (right.is_undefined()) undefined_error(right);
      if (op == "<") {
        r = less(left, right);
      } else if (op == ">") {
        r = less(right, left);
      } else if (op == "<=") {
        r = !less(right, left);
      } else {
        r = !less(left, right);
      }
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Interpreter::eval_binop(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  bool ints = a.is_number() && b.is_number() && a.type != Value::Type::Float && b.type != Value::Type::Float;
  if (op == "+") {
    if (ints) return Value::integer(add(as_int(a), as_int(b)));
    if (a.is_number() && b.is_number()) return Value::number(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) return Value::string(check_size(a.s + b.s));
    if (a.is_list() && b.is_list() && a.list->tuple == b.list->tuple) {
      std::vector<Value> items = a.list->items;
      items.insert(items.end(), b.list->items.begin(), b.list->items.end());
      return Value::make_list(std::move(items), a.list->tuple);
    }
    type_error("+", a, b);
  }
  if (op == "-") {
    if (ints) return Value::integer(sub(as_int(a), as_int(b)));
    if (a.is_number() && b.is_number()) return Value::number(a.as_double() - b.as_double());
    type_error("-", a, b);
  }
  if (op == "*") {
    if (ints) return Value::integer(mul(as_int(a), as_int(b)));
    if (a.is_number() && b.is_number()) return Value::number(a.as_double() * b.as_double());
    const Value* seq = a.is_string() || a.is_list() ? &a : &b;
    const Value* n = seq == &a ? &b : &a;
    if ((seq->is_string() || seq->is_list()) && n->is_number() && n->type != Value::Type::Float) {
      int64_t times = std::max<int64_t>(0, as_int(*n));
      if (seq->is_string() && seq->s.empty()) return Value::string("");  // any count of nothing
      if (seq->is_list() && seq->list->items.empty()) return Value::make_list({}, seq->list->tuple);
      // Bytes the copies take: a list item is a Value (nested lists and dicts are shared, strings
      // are copied). Checked, so that a huge count cannot wrap to a small product.
      int64_t unit = static_cast<int64_t>(seq->s.size());
      if (seq->is_list()) {
        unit = 0;
        for (const Value& v : seq->list->items) unit += static_cast<int64_t>(sizeof(Value) + v.s.size());
      }
      int64_t bytes = 0;
      KILN_CHECK(!__builtin_mul_overflow(times, unit, &bytes) && bytes <= static_cast<int64_t>(kMaxString),
                 "repetition result is too large (over {} bytes)", kMaxString);
      if (seq->is_string()) {
        std::string s;
        for (int64_t k = 0; k < times; ++k) s += seq->s;
        return Value::string(std::move(s));
      }
      std::vector<Value> items;
      for (int64_t k = 0; k < times; ++k) items.insert(items.end(), seq->list->items.begin(), seq->list->items.end());
      return Value::make_list(std::move(items), seq->list->tuple);
    }
    type_error("*", a, b);
  }
  if (op == "%" && a.is_string()) return Value::string(percent_format(a.s, b));
  KILN_CHECK(a.is_number() && b.is_number(), "unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a),
             type_name(b));
  if (op == "/") {
    KILN_CHECK(b.as_double() != 0, "division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (ints) {
      int64_t x = as_int(a), y = as_int(b);
      KILN_CHECK(y != 0, "integer division or modulo by zero");
      KILN_CHECK(!(x == INT64_MIN && y == -1), "integer overflow");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value::integer(op == "//" ? q : m);
    }
    // CPython's float_divmod.
    double x = a.as_double(), y = b.as_double();
    KILN_CHECK(y != 0, "float division or modulo by zero");
    double m = std::fmod(x, y);
    double div = (x - m) / y;
    if (m != 0 && ((y < 0) != (m < 0))) {
      m += y;
      div -= 1.0;
    }
    if (m == 0) m = std::copysign(0.0, y);
    double floordiv = div != 0 ? std::floor(div) : std::copysign(0.0, x / y);
    if (div != 0 && div - floordiv > 0.5) floordiv += 1.0;
    return Value::number(op == "//" ? floordiv : m);
  }
  if (op == "**") {
    if (ints && as_int(b) >= 0) {
      int64_t base = as_int(a), result = 1;
      for (int64_t k = 0; k < as_int(b); ++k) result = mul(result, base);
      return Value::integer(result);
    }
    return Value::number(std::pow(a.as_double(), b.as_double()));
  }
  fail("unknown operator {}", op);
}

void Interpreter::exec(const Body& body, std::string& out) {
  for (const auto& s : body) {
    exec_stmt(*s, out);
    if (break_ || continue_) return;
  }
}

void Interpreter::exec_stmt(const Stmt& s, std::string& out) {
  line_ = s.line;
  try {
    KILN_CHECK(++steps_ <= kMaxSteps, "template runs more than {} steps", kMaxSteps);
    KILN_CHECK(out.size() <= kMaxString, "template output exceeds {} bytes", kMaxString);
    switch (s.kind) {
      case Stmt::Kind::Text: out += s.text; break;
      case Stmt::Kind::Output: out += py_str(eval(*s.expr)); break;
      case Stmt::Kind::If: {
        for (size_t k = 0; k < s.conds.size(); ++k) {
          line_ = s.line;
          if (truthy(eval(*s.conds[k]))) {
            exec(s.bodies[k], out);
            return;
          }
        }
        exec(s.else_body, out);
        break;
      }
      case Stmt::Kind::For: exec_for(s, out); break;
      case Stmt::Kind::Set: assign(s.target, eval(*s.expr)); break;
      case Stmt::Kind::SetBlock: {
        std::string inner;
        exec(s.body, inner);
        Value v = Value::string(std::move(inner));
        if (s.filter) {
          // The chain was parsed with a null subject: apply it to the captured text.
          std::vector<const Expr*> chain;
          for (const Expr* f = s.filter.get(); f; f = f->a.get()) chain.insert(chain.begin(), f);
          for (const Expr* f : chain) v = apply_filter(*this, f->name, v, eval_args(*f));
        }
        assign(s.target, std::move(v));
        break;
      }
      case Stmt::Kind::Macro: frame_->vars[s.name] = make_macro(s); break;
      case Stmt::Kind::FilterBlock: {
        std::string inner;
        exec(s.body, inner);
        Value v = Value::string(std::move(inner));
        std::vector<const Expr*> chain;
        for (const Expr* f = s.filter.get(); f; f = f->a.get()) chain.insert(chain.begin(), f);
        for (const Expr* f : chain) v = apply_filter(*this, f->name, v, eval_args(*f));
        out += py_str(v);
        break;
      }
      case Stmt::Kind::Break: break_ = true; break;
      case Stmt::Kind::Continue: continue_ = true; break;
    }
  } catch (const kiln::Error& err) {
    std::string msg = err.what();
    if (msg.rfind("chat template line ", 0) == 0) throw;
    fail("chat template line {}: {}", line_, msg);
  }
}

void Interpreter::exec_for(const Stmt& s, std::string& out) {
  Value seq = eval(*s.expr);
  KILN_CHECK(!seq.is_none(), "'NoneType' object is not iterable");
  std::vector<Value> items = iterate(seq);
  auto loop_frame = std::make_shared<Frame>();
  loop_frame->parent = frame_;
  std::shared_ptr<Frame> saved = frame_;
  frame_ = loop_frame;
  if (s.filter) {
    std::vector<Value> kept;
    for (Value& v : items) {
      KILN_CHECK(++steps_ <= kMaxSteps, "template runs more than {} steps", kMaxSteps);
      assign(s.target, v);
      if (truthy(eval(*s.filter))) kept.push_back(std::move(v));
    }
    items = std::move(kept);
  }
  auto n = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < n; ++k) {
    KILN_CHECK(++steps_ <= kMaxSteps, "template runs more than {} steps", kMaxSteps);
    Value loop = Value::make_dict(Dict::Kind::Loop);
    auto set = [&](const char* name, Value v) { loop.dict->items.emplace_back(Value::string(name), std::move(v)); };
    set("index", Value::integer(k + 1));
    set("index0", Value::integer(k));
    set("revindex", Value::integer(n - k));
    set("revindex0", Value::integer(n - k - 1));
    set("first", Value::boolean(k == 0));
    set("last", Value::boolean(k == n - 1));
    set("length", Value::integer(n));
    set("depth", Value::integer(1));
    set("depth0", Value::integer(0));
    set("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("previtem"));
    set("nextitem", k + 1 < n ? items[static_cast<size_t>(k + 1)] : Value::undefined("nextitem"));
    set("cycle", Value::function("cycle", [k](Interpreter&, const Args& a) {
          KILN_CHECK(!a.pos.empty(), "loop.cycle() needs at least one argument");
          return a.pos[static_cast<size_t>(k) % a.pos.size()];
        }));
    frame_->vars["loop"] = loop;
    assign(s.target, items[static_cast<size_t>(k)]);
    exec(s.body, out);
    continue_ = false;
    if (break_) {
      break_ = false;
      break;
    }
  }
  frame_ = saved;
  if (n == 0) exec(s.else_body, out);
}

Value Interpreter::make_macro(const Stmt& s) {
  // Weak: the macro lives in the frame it captures, and a strong pointer would be a cycle.
  std::weak_ptr<Frame> defining = frame_;
  const Stmt* def = &s;
  std::shared_ptr<const Template> keep = tmpl_;
  return Value::function(s.name, [defining, def, keep](Interpreter& in, const Args& args) {
    KILN_CHECK(args.pos.size() <= def->params.size(), "macro '{}' takes {} arguments, {} given", def->name,
               def->params.size(), args.pos.size());
    KILN_CHECK(in.depth_ < kMaxDepth, "macro recursion is too deep");
    auto f = std::make_shared<Frame>();
    f->parent = defining.lock();
    if (!f->parent) f->parent = in.frame_;  // called after its scope ended: resolve from the caller
    std::shared_ptr<Frame> saved = in.frame_;
    int saved_line = in.line_;
    in.frame_ = f;
    ++in.depth_;
    for (const auto& [k, v] : args.kw) {
      bool known = false;
      for (const auto& p : def->params) known |= p == k;
      KILN_CHECK(known, "macro '{}' has no parameter '{}'", def->name, k);
    }
    for (size_t k = 0; k < def->params.size(); ++k) {
      const Value* v = args.get(def->params[k], k);
      if (v) {
        f->vars[def->params[k]] = *v;
      } else if (def->defaults[k]) {
        f->vars[def->params[k]] = in.eval(*def->defaults[k]);
      } else {
        f->vars[def->params[k]] = Value::undefined(def->params[k]);
      }
    }
    std::string out;
    try {
      in.exec(def->body, out);
    } catch (...) {
      in.frame_ = saved;
      --in.depth_;
      throw;
    }
    in.frame_ = saved;
    in.line_ = saved_line;
    --in.depth_;
    in.break_ = in.continue_ = false;
    return Value::string(std::move(out));
  });
}

}  // namespace kiln::jinja

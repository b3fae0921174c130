// Expression parsing with Jinja's precedence: condexpr < or < and < not < comparisons < + - <
// ~ < * / // % < ** < unary < postfix (.attr, [item], call) < filters and tests.
#include <charconv>

#include "core/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/parser_impl.h"

namespace kiln::jinja {

namespace {

Value integer_literal(const std::string& digits, int line) {
  int64_t v = 0;
  auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size())
    fail("chat template line {}: integer {} is out of range", line, digits);
  return Value::integer(v);
}

}  // namespace

ExprPtr Parser::tuple(bool with_condexpr) {
  int line = peek().line;
  ExprPtr first = expression(with_condexpr);
  if (!is_op(",")) return first;
  auto t = node(Expr::Kind::Tuple, line);
  t->args.push_back(std::move(first));
  while (is_op(",")) {
    ++i_;
    if (peek().type == TokType::BlockEnd || peek().type == TokType::VarEnd || is_name("in") || is_op(")")) break;
    t->args.push_back(expression(with_condexpr));
  }
  return t;
}

ExprPtr Parser::expression(bool with_condexpr) {
  Nest nest(*this);
  ExprPtr e = or_expr();
  if (!with_condexpr) return e;
  while (is_name("if")) {
    int line = peek().line;
    ++i_;
    auto c = node(Expr::Kind::CondExpr, line);
    c->a = std::move(e);
    c->b = or_expr();
    if (is_name("else")) {
      ++i_;
      c->c = expression(true);
    }
    e = std::move(c);
  }
  return e;
}

ExprPtr Parser::binary_chain(Expr::Kind kind, const char* word, ExprPtr (Parser::*sub)()) {
  ExprPtr left = (this->*sub)();
  while (is_name(word)) {
    int line = peek().line;
    ++i_;
    auto n = node(kind, line);
    n->a = std::move(left);
    n->b = (this->*sub)();
    left = std::move(n);
  }
  return left;
}

ExprPtr Parser::not_expr() {
  Nest nest(*this);
  if (is_name("not")) {
    auto n = node(Expr::Kind::Not, next().line);
    n->a = not_expr();
    return n;
  }
  return compare();
}

ExprPtr Parser::compare() {
  int line = peek().line;
  ExprPtr first = math1();
  ExprPtr cmp;
  for (;;) {
    std::string op;
    if (peek().type == TokType::Op &&
        (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
      op = next().value;
    } else if (is_name("in")) {
      ++i_;
      op = "in";
    } else if (is_name("not") && is_name("in", 1)) {
      i_ += 2;
      op = "notin";
    } else {
      break;
    }
    if (!cmp) {
      cmp = node(Expr::Kind::Compare, line);
      cmp->a = std::move(first);
    }
    cmp->ops.push_back(op);
    cmp->args.push_back(math1());
  }
  return cmp ? std::move(cmp) : std::move(first);
}

ExprPtr Parser::binop(ExprPtr left, const std::string& op, ExprPtr right, int line) {
  auto n = node(Expr::Kind::BinOp, line);
  n->name = op;
  n->a = std::move(left);
  n->b = std::move(right);
  return n;
}

ExprPtr Parser::math1() {
  ExprPtr left = concat();
  while (is_op("+") || is_op("-")) {
    int line = peek().line;
    std::string op = next().value;
    left = binop(std::move(left), op, concat(), line);
  }
  return left;
}

ExprPtr Parser::concat() {
  int line = peek().line;
  ExprPtr first = math2();
  if (!is_op("~")) return first;
  auto n = node(Expr::Kind::Concat, line);
  n->args.push_back(std::move(first));
  while (is_op("~")) {
    ++i_;
    n->args.push_back(math2());
  }
  return n;
}

ExprPtr Parser::math2() {
  ExprPtr left = power();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    int line = peek().line;
    std::string op = next().value;
    left = binop(std::move(left), op, power(), line);
  }
  return left;
}

ExprPtr Parser::power() {
  ExprPtr left = unary(true);
  while (is_op("**")) {
    int line = next().line;
    left = binop(std::move(left), "**", unary(true), line);
  }
  return left;
}

ExprPtr Parser::unary(bool with_filter) {
  Nest nest(*this);
  ExprPtr e;
  if (is_op("-") || is_op("+")) {
    int line = peek().line;
    auto n = node(next().value == "-" ? Expr::Kind::Neg : Expr::Kind::Pos, line);
    n->a = unary(false);
    e = std::move(n);
  } else {
    e = primary();
  }
  e = postfix(std::move(e));
  if (with_filter) e = filters(std::move(e));
  return e;
}

ExprPtr Parser::primary() {
  const Token& k = peek();
  int line = k.line;
  if (k.type == TokType::Name) {
    std::string n = next().value;
    auto lit = node(Expr::Kind::Literal, line);
    if (n == "true" || n == "True") {
      lit->literal = Value::boolean(true);
    } else if (n == "false" || n == "False") {
      lit->literal = Value::boolean(false);
    } else if (n == "none" || n == "None") {
      lit->literal = Value::none();
    } else {
      auto nm = node(Expr::Kind::Name, line);
      nm->name = n;
      return nm;
    }
    return lit;
  }
  if (k.type == TokType::String) {
    std::string s;
    while (peek().type == TokType::String) s += next().value;  // adjacent literals concatenate
    auto lit = node(Expr::Kind::Literal, line);
    lit->literal = Value::string(std::move(s));
    return lit;
  }
  if (k.type == TokType::Int || k.type == TokType::Float) {
    auto lit = node(Expr::Kind::Literal, line);
    std::string v = next().value;
    try {
      lit->literal = k.type == TokType::Int ? Value::integer(std::stoll(v)) : Value::number(std::stod(v));
    } catch (const std::exception&) {
      fail("chat template line {}: number {} is out of range", line, v);
    }
    return lit;
  }
  if (is_op("(")) {
    ++i_;
    if (is_op(")")) {
      ++i_;
      auto t = node(Expr::Kind::Tuple, line);
      return t;
    }
    ExprPtr e = tuple(true);
    expect_op(")");
    return e;
  }
  if (is_op("[")) {
    ++i_;
    auto l = node(Expr::Kind::List, line);
    while (!is_op("]")) {
      l->args.push_back(expression(true));
      if (!is_op("]")) expect_op(",");
    }
    ++i_;
    return l;
  }
  if (is_op("{")) {
    ++i_;
    auto d = node(Expr::Kind::Dict, line);
    while (!is_op("}")) {
      d->args.push_back(expression(true));
      expect_op(":");
      d->args.push_back(expression(true));
      if (!is_op("}")) expect_op(",");
    }
    ++i_;
    return d;
  }
  error(cat("unexpected token in expression", got()));
}

ExprPtr Parser::postfix(ExprPtr e) {
  for (;;) {
    int line = peek().line;
    if (is_op(".")) {
      ++i_;
      auto g = node(Expr::Kind::GetAttr, line);
      if (peek().type == TokType::Int) {
        // foo.0 reads item 0
        g->kind = Expr::Kind::GetItem;
        g->b = node(Expr::Kind::Literal, line);
        g->b->literal = integer_literal(next().value, line);
      } else {
        g->name = name();
      }
      g->a = std::move(e);
      e = std::move(g);
    } else if (is_op("[")) {
      ++i_;
      e = subscript(std::move(e), line);
    } else if (is_op("(")) {
      e = call(std::move(e));
    } else {
      return e;
    }
  }
}

ExprPtr Parser::subscript(ExprPtr obj, int line) {
  ExprPtr parts[3];
  int n = 0;
  bool slice = false;
  for (;;) {
    if (is_op("]")) break;
    if (is_op(":")) {
      ++i_;
      slice = true;
      if (++n > 2) error("too many ':' in a slice");
      continue;
    }
    parts[n] = expression(true);
    if (!is_op(":") && !is_op("]")) error(cat("expected ':' or ']'", got()));
  }
  ++i_;
  if (!slice) {
    if (!parts[0]) error("empty subscript");
    auto g = node(Expr::Kind::GetItem, line);
    g->a = std::move(obj);
    g->b = std::move(parts[0]);
    return g;
  }
  auto s = node(Expr::Kind::Slice, line);
  s->a = std::move(obj);
  for (auto& p : parts) s->args.push_back(std::move(p));
  return s;
}

void Parser::call_args(Expr& target) {
  expect_op("(");
  while (!is_op(")")) {
    if (is_op("*") || is_op("**")) error("*args and **kwargs in calls are not supported");
    if (peek().type == TokType::Name && is_op("=", 1)) {
      std::string k = next().value;
      ++i_;
      target.kwargs.emplace_back(k, expression(true));
    } else {
      if (!target.kwargs.empty()) error("positional argument after keyword argument");
      target.args.push_back(expression(true));
    }
    if (!is_op(")")) expect_op(",");
  }
  ++i_;
}

ExprPtr Parser::call(ExprPtr callee) {
  auto c = node(Expr::Kind::Call, peek().line);
  c->a = std::move(callee);
  call_args(*c);
  return c;
}

ExprPtr Parser::filter_chain(ExprPtr subject) {
  while (is_op("|")) {
    int line = next().line;
    auto f = node(Expr::Kind::Filter, line);
    f->name = name();
    if (!is_known_filter(f->name)) fail("chat template line {}: no filter named '{}'", line, f->name);
    f->a = std::move(subject);
    if (is_op("(")) call_args(*f);
    subject = std::move(f);
  }
  return subject;
}

ExprPtr Parser::filters(ExprPtr e) {
  for (;;) {
    if (is_op("|")) {
      e = filter_chain(std::move(e));
    } else if (is_name("is")) {
      int line = next().line;
      auto t = node(Expr::Kind::Test, line);
      if (is_name("not")) {
        ++i_;
        t->negated = true;
      }
      t->name = name();
      if (!is_known_test(t->name)) fail("chat template line {}: no test named '{}'", line, t->name);
      t->a = std::move(e);
      if (is_op("(")) {
        call_args(*t);
      } else if ((peek().type == TokType::Name || peek().type == TokType::String || peek().type == TokType::Int ||
                  peek().type == TokType::Float || is_op("[") || is_op("{")) &&
                 !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") && !is_name("in") &&
                 !is_name("not") && !is_name("is")) {
        t->args.push_back(postfix(primary()));
      }
      e = std::move(t);
    } else if (is_op("(")) {
      e = call(std::move(e));
    } else {
      return e;
    }
  }
}

}  // namespace kiln::jinja

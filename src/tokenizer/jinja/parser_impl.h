// Internal: the template parser's class, shared by parser.cc (statements) and parser_expr.cc
// (expressions, with Jinja's operator precedence).
#pragma once

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/lexer.h"

namespace kiln::jinja {

// Appends pieces; GCC 12 mis-warns (-Wrestrict) on chains of std::string operator+.
template <typename... A>
std::string cat(const A&... a) {
  std::string s;
  (s.append(a), ...);
  return s;
}

// Deeply nested input ("((((((...", 10000 nested ifs) would overflow the stack of a
// recursive-descent parser; refuse it with an error instead.
constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}
  std::shared_ptr<const Template> run();

 private:
  const Token& peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(i_++, t_.size() - 1)]; }
  [[noreturn]] void error(const std::string& msg) const { fail("chat template line {}: {}", peek().line, msg); }
  bool is_op(const char* op, size_t k = 0) const { return peek(k).type == TokType::Op && peek(k).value == op; }
  bool is_name(const char* n, size_t k = 0) const { return peek(k).type == TokType::Name && peek(k).value == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) error(cat("expected '", op, "'", got()));
    ++i_;
  }
  void expect_name(const char* n) {
    if (!is_name(n)) error(cat("expected '", n, "'", got()));
    ++i_;
  }
  void expect_block_end() {
    if (peek().type != TokType::BlockEnd) error(cat("expected end of statement '%}'", got()));
    ++i_;
  }
  std::string got() const {
    const Token& k = peek();
    switch (k.type) {
      case TokType::Eof: return ", got end of template";
      case TokType::BlockEnd: return ", got '%}'";
      case TokType::VarEnd: return ", got '}}'";
      case TokType::Text: return ", got text";
      default: return cat(", got '", k.value, "'");
    }
  }
  std::string name() {
    if (peek().type != TokType::Name) error(cat("expected a name", got()));
    return next().value;
  }
  ExprPtr node(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // Statements (parser.cc).
  Body statements(const std::set<std::string>& ends, std::string& found);
  void statement(Body& body);
  Target target(bool allow_attr);

  // Expressions (parser_expr.cc).
  ExprPtr or_expr() { return binary_chain(Expr::Kind::Or, "or", &Parser::and_expr); }
  ExprPtr and_expr() { return binary_chain(Expr::Kind::And, "and", &Parser::not_expr); }
  ExprPtr tuple(bool with_condexpr);
  ExprPtr expression(bool with_condexpr);
  ExprPtr binary_chain(Expr::Kind kind, const char* word, ExprPtr (Parser::*sub)());
  ExprPtr not_expr();
  ExprPtr compare();
  ExprPtr binop(ExprPtr left, const std::string& op, ExprPtr right, int line);
  ExprPtr math1();
  ExprPtr concat();
  ExprPtr math2();
  ExprPtr power();
  ExprPtr unary(bool with_filter);
  ExprPtr primary();
  ExprPtr postfix(ExprPtr e);
  ExprPtr subscript(ExprPtr obj, int line);
  void call_args(Expr& target);
  ExprPtr call(ExprPtr callee);
  ExprPtr filter_chain(ExprPtr subject);
  ExprPtr filters(ExprPtr e);

  struct Nest {
    explicit Nest(Parser& p) : p_(p) {
      if (++p_.depth_ > kMaxNesting) p_.error("template nests too deeply");
    }
    ~Nest() { --p_.depth_; }
    Parser& p_;
  };

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace kiln::jinja

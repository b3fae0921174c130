#include "tokenizer/jinja/parser.h"

#include "core/error.h"
#include "tokenizer/jinja/interpreter.h"
#include "tokenizer/jinja/parser_impl.h"

namespace kiln::jinja {

std::shared_ptr<const Template> Parser::run() {
  auto tmpl = std::make_shared<Template>();
  std::string found;
  tmpl->body = statements({}, found);
  return tmpl;
}

Body Parser::statements(const std::set<std::string>& ends, std::string& found) {
  Body body;
  for (;;) {
    const Token& k = peek();
    if (k.type == TokType::Eof) {
      if (!ends.empty()) {
        std::string end = *ends.begin();
        for (const auto& e : ends)
          if (e.rfind("end", 0) == 0) end = e;
        error(cat("missing {% ", end, " %} (template ended inside a block)"));
      }
      return body;
    }
    if (k.type == TokType::Text) {
      auto s = std::make_unique<Stmt>();
      s->kind = Stmt::Kind::Text;
      s->line = k.line;
      s->text = next().value;
      body.push_back(std::move(s));
    } else if (k.type == TokType::VarBegin) {
      ++i_;
      auto s = std::make_unique<Stmt>();
      s->kind = Stmt::Kind::Output;
      s->line = k.line;
      s->expr = tuple(true);
      if (peek().type != TokType::VarEnd) error(cat("expected '}}'", got()));
      ++i_;
      body.push_back(std::move(s));
    } else if (k.type == TokType::BlockBegin) {
      if (peek(1).type == TokType::Name && ends.count(peek(1).value)) {
        i_ += 2;
        found = t_[i_ - 1].value;
        return body;
      }
      ++i_;
      statement(body);
    } else {
      error(cat("unexpected token", got()));
    }
  }
}

void Parser::statement(Body& body) {
  Nest nest(*this);
  int line = peek().line;
  std::string tag = name();
  auto s = std::make_unique<Stmt>();
  s->line = line;
  std::string found;
  if (tag == "if") {
    s->kind = Stmt::Kind::If;
    s->conds.push_back(expression(true));
    expect_block_end();
    s->bodies.push_back(statements({"elif", "else", "endif"}, found));
    while (found == "elif") {
      s->conds.push_back(expression(true));
      expect_block_end();
      s->bodies.push_back(statements({"elif", "else", "endif"}, found));
    }
    if (found == "else") {
      expect_block_end();
      s->else_body = statements({"endif"}, found);
    }
    expect_block_end();
  } else if (tag == "for") {
    s->kind = Stmt::Kind::For;
    s->target = target(false);
    expect_name("in");
    s->expr = tuple(false);
    if (is_name("if")) {
      ++i_;
      s->filter = expression(true);
    }
    if (is_name("recursive")) error("recursive loops are not supported");
    expect_block_end();
    s->body = statements({"endfor", "else"}, found);
    if (found == "else") {
      expect_block_end();
      s->else_body = statements({"endfor"}, found);
    }
    expect_block_end();
  } else if (tag == "set") {
    s->target = target(true);
    if (is_op("=")) {
      ++i_;
      s->kind = Stmt::Kind::Set;
      s->expr = tuple(true);
      expect_block_end();
    } else {
      s->kind = Stmt::Kind::SetBlock;
      if (s->target.tuple || !s->target.attr.empty()) error("a block set needs a single name");
      if (is_op("|")) s->filter = filters(nullptr);
      expect_block_end();
      s->body = statements({"endset"}, found);
      expect_block_end();
    }
  } else if (tag == "macro") {
    s->kind = Stmt::Kind::Macro;
    s->name = name();
    expect_op("(");
    while (!is_op(")")) {
      s->params.push_back(name());
      if (is_op("=")) {
        ++i_;
        s->defaults.push_back(expression(true));
      } else {
        s->defaults.push_back(nullptr);
      }
      if (!is_op(")")) expect_op(",");
    }
    ++i_;
    expect_block_end();
    s->body = statements({"endmacro"}, found);
    if (peek().type == TokType::Name) ++i_;  // {% endmacro name %}
    expect_block_end();
  } else if (tag == "filter") {
    s->kind = Stmt::Kind::FilterBlock;
    auto f = node(Expr::Kind::Filter, line);
    f->name = name();
    if (!is_known_filter(f->name)) fail("chat template line {}: no filter named '{}'", line, f->name);
    if (is_op("(")) call_args(*f);
    s->filter = filter_chain(std::move(f));
    expect_block_end();
    s->body = statements({"endfilter"}, found);
    expect_block_end();
  } else if (tag == "break" || tag == "continue") {
    s->kind = tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
    expect_block_end();
  } else if (tag == "generation") {
    // transformers' AssistantTracker tag: renders its body unchanged.
    expect_block_end();
    Body inner = statements({"endgeneration"}, found);
    expect_block_end();
    for (auto& st : inner) body.push_back(std::move(st));
    return;
  } else {
    fail("chat template line {}: unsupported statement '{{% {} %}}'", line, tag);
  }
  body.push_back(std::move(s));
}

Target Parser::target(bool allow_attr) {
  Target tg;
  bool paren = is_op("(");
  if (paren) ++i_;
  tg.names.push_back(name());
  if (allow_attr && is_op(".")) {
    ++i_;
    tg.attr = name();
    return tg;
  }
  while (is_op(",")) {
    ++i_;
    tg.tuple = true;
    if (peek().type != TokType::Name) break;
    tg.names.push_back(name());
  }
  if (paren) expect_op(")");
  return tg;
}

std::shared_ptr<const Template> parse_template(std::string_view source) {
  return Parser(lex(source)).run();
}

}  // namespace kiln::jinja

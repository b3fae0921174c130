// Syntax tree of a parsed template. Nodes are plain data ("fat" structs keyed by kind) so the
// parser and the interpreter stay independent; every node keeps its template line for errors.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace kiln::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    Literal,   // literal
    Name,      // name
    List,      // args
    Tuple,     // args
    Dict,      // args: key0, value0, key1, value1, ...
    GetAttr,   // a . name
    GetItem,   // a [ b ]
    Slice,     // a [ args[0] : args[1] : args[2] ] (null parts allowed)
    Call,      // a ( args, kwargs )
    Filter,    // a | name(args, kwargs); a is null inside {% filter %}
    Test,      // a is [not] name(args)
    Neg,       // - a
    Pos,       // + a
    Not,       // not a
    And,       // a and b
    Or,        // a or b
    BinOp,     // a op b (op in name: + - * / // % **)
    Concat,    // args joined with ~
    Compare,   // a ops[0] args[0] ops[1] args[1] ...
    CondExpr,  // a if b else c (c may be null)
  };
  Kind kind;
  int line = 0;
  Value literal;
  std::string name;
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
};

// Where `set` and `for` store values: names (one, or several to unpack a tuple) or `ns.attr`.
struct Target {
  std::vector<std::string> names;
  std::string attr;  // non-empty: names[0].attr
  bool tuple = false;
};

struct Stmt {
  enum class Kind {
    Text,      // text
    Output,    // expr
    If,        // conds[i] -> bodies[i]; else_body
    For,       // target in expr [if filter]; body; else_body
    Set,       // target = expr
    SetBlock,  // target = rendered body (optionally through filter)
    Macro,     // name(params = defaults) body
    FilterBlock,
    Break,
    Continue,
  };
  Kind kind;
  int line = 0;
  std::string text;
  ExprPtr expr, filter;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body, else_body;
  Target target;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // parallel to params (null: required)
};

struct Template {
  Body body;
};

}  // namespace kiln::jinja

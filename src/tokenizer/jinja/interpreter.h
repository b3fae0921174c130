// Renders a parsed Template. Variables live in a chain of frames: the render arguments at the
// root, a frame per for loop (assignments inside a loop do not leak out, as in Jinja) and per
// macro call; `if` blocks share their enclosing frame.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace kiln::jinja {

// A width a template asks a string to be padded or indented to, checked against kMaxTemplateString.
int64_t checked_width(int64_t width);

class Interpreter {
 public:
  explicit Interpreter(std::shared_ptr<const Template> t) : tmpl_(std::move(t)) {}
  // Throws kiln::Error ("chat template line N: ...") for runtime errors and raise_exception().
  std::string render(const std::vector<std::pair<std::string, Value>>& vars);

  // For builtins: calls a function value (filters like map and select need this).
  Value call(const Value& fn, const Args& args);
  // Namespaces are the only mutable containers, so every reference cycle passes through one
  // (`{% set ns.self = ns %}`); render() empties them at the end to free such cycles.
  void track_namespace(const std::shared_ptr<Dict>& d) { namespaces_.push_back(d); }
  int line() const { return line_; }

 private:
  struct Frame {
    std::unordered_map<std::string, Value> vars;
    std::shared_ptr<Frame> parent;
  };
  Value lookup(const std::string& name) const;
  void assign(const Target& t, Value v);
  Value eval(const Expr& e);
  Value eval_compare(const Expr& e);
  Value eval_binop(const std::string& op, const Value& a, const Value& b);
  Args eval_args(const Expr& e);
  void exec(const Body& body, std::string& out);
  void exec_stmt(const Stmt& s, std::string& out);
  void exec_for(const Stmt& s, std::string& out);
  Value make_macro(const Stmt& s);

  std::shared_ptr<const Template> tmpl_;
  std::shared_ptr<Frame> frame_;
  bool break_ = false, continue_ = false;
  int line_ = 0;
  int depth_ = 0;
  uint64_t steps_ = 0;  // statements run + loop iterations, against kMaxSteps
  std::vector<std::weak_ptr<Dict>> namespaces_;
};

// Builtins (builtins.cc, filters.cc, methods.cc). Unknown filter and test names are rejected when
// the template is parsed, as Jinja does.
bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);
Value apply_filter(Interpreter& in, const std::string& name, const Value& v, const Args& args);
bool apply_test(Interpreter& in, const std::string& name, const Value& v, const Args& args);
// Jinja's getattr (obj.name): Python attributes (methods) first, then items.
Value get_attr(const Value& obj, const std::string& name);
// Jinja's getitem (obj[key]): items first, then attributes.
Value get_item(const Value& obj, const Value& key);
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
std::vector<Value> iterate(const Value& v);  // Python iteration (dict -> keys, str -> chars)
void add_globals(std::unordered_map<std::string, Value>& vars);
[[noreturn]] void undefined_error(const Value& u);

}  // namespace kiln::jinja

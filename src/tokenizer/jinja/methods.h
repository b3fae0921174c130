// Python methods reachable from templates: str (strip, split, startswith, replace, format, ...),
// dict (items, keys, values, get) and list (index, count). Methods that mutate a list or dict are
// refused, as transformers' ImmutableSandboxedEnvironment refuses them.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace kiln::jinja {

// The bound method `obj.name`, or Undefined when obj has no such method.
Value method(const Value& obj, const std::string& name);

// Shared string helpers (Python semantics).
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit);
std::vector<std::string> py_splitlines(const std::string& s, bool keepends);
std::string py_capitalize(const std::string& s);
// Python's printf-style `fmt % args` (%s %r %d %i %f %%); args is a tuple or a single value.
std::string percent_format(const std::string& fmt, const Value& args);
std::string py_replace(const std::string& s, const std::string& old, const std::string& rep, int64_t count);

}  // namespace kiln::jinja

// Parses the lexer's tokens into a Template. Supported statements: if/elif/else, for (with
// `if` filter and else), set (plain, tuple, namespace attribute, block), macro, filter blocks,
// break/continue, raw (in the lexer) and transformers' generation tag. Anything else is a
// kiln::Error naming the template line.
#pragma once

#include <memory>
#include <string_view>

#include "tokenizer/jinja/ast.h"

namespace kiln::jinja {

std::shared_ptr<const Template> parse_template(std::string_view source);

}  // namespace kiln::jinja

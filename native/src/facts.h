// Engine facts that cross N-API are declared once. A struct's fields (an option with its default, a
// counter) and an enum's values are X-macro lists beside the struct or enum they define; the addon
// expands each list into its conversion (addon/) and into engineTypes(), which `npm run
// gen:engine-types` renders as native/engine-types.generated.ts: the TS interfaces, the value lists
// (PREFIX_SHARINGS) and the defaults (GENERATOR_DEFAULTS) the config schemas read.
// test/engine-types.test.ts fails while that file differs from what the addon declares.
//
// This header holds what those lists share: enums with their names (PRIME_ENUM), the type names TS
// gives to C++ field types, and OptionError, the engine's error about one option of a call.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace prime {

// An error about one option or field of a call, named as the caller names it (the TS name, e.g.
// "pagedAttentionKernel"): the addon throws it as a JS Error carrying `option` and `reason`, with
// the message "<option>: <reason>". Callers tell errors apart by `option`, never by the message.
class OptionError : public std::runtime_error {
 public:
  OptionError(std::string option, std::string reason)
      : std::runtime_error(option + ": " + reason), option(std::move(option)), reason(std::move(reason)) {}
  const std::string option, reason;
};

// The names of an enum declared by PRIME_ENUM, in declaration order (value i is names[i]).
template <typename E>
struct EnumInfo;

#define PRIME_ENUM_CONSTANT(constant, name) constant,
#define PRIME_ENUM_NAME(constant, name) name,
// enum class Enum over LIST(X), each X(constant, "name"); TS gets `type Enum` and `const TS_LIST`
// (its names, in this order).
#define PRIME_ENUM(Enum, LIST, tsList)                                                                 \
  enum class Enum { LIST(PRIME_ENUM_CONSTANT) };                                                       \
  template <>                                                                                          \
  struct EnumInfo<Enum> {                                                                              \
    static constexpr const char* type = #Enum;                                                         \
    static constexpr const char* list = tsList;                                                        \
    static constexpr std::array<const char*, 0 LIST(PRIME_ENUM_COUNT)> names{{LIST(PRIME_ENUM_NAME)}}; \
  };
#define PRIME_ENUM_COUNT(constant, name) +1

template <typename E>
const char* enumName(E value) {
  return EnumInfo<E>::names[size_t(value)];
}

// The names of an enum's values, "a, b, c".
template <typename E>
std::string enumNames() {
  std::string all;
  for (const char* name : EnumInfo<E>::names) all += (all.empty() ? "" : ", ") + std::string(name);
  return all;
}

// The value named `name`; else an OptionError naming `option` and the values.
template <typename E>
E parseEnum(const std::string& name, const std::string& option) {
  const auto& names = EnumInfo<E>::names;
  for (size_t i = 0; i < names.size(); i++)
    if (name == names[i]) return E(i);
  throw OptionError(option, "'" + name + "' is not one of " + enumNames<E>());
}

// The TS type of a field's C++ type (engineTypes()): numbers, booleans, the enums by name.
template <typename T>
const char* tsType() {
  if constexpr (std::is_same_v<T, bool>) return "boolean";
  else if constexpr (std::is_enum_v<T>) return EnumInfo<T>::type;
  else return "number";
}

}  // namespace prime

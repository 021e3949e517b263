#include "codecs/codec.h"
#include "core/errors.h"

namespace pyring {

// The entries, defined in their folders; a Wire is the index here.
const Codec& fp32_codec();    // codecs/builtin.cc
const Codec& fp16_codec();    // codecs/builtin.cc
const Codec& bf16_codec();    // codecs/builtin.cc
const Codec& onebit_codec();  // codecs/builtin.cc
const Codec& int8_codec();    // codecs/int8/

const std::vector<const Codec*>& codecs() {
  static const std::vector<const Codec*> list = {&fp32_codec(), &fp16_codec(), &bf16_codec(),
                                                 &onebit_codec(), &int8_codec()};
  return list;
}

namespace {

std::string valid_names() {
  std::string s;
  for (const Codec* c : codecs()) s += (s.empty() ? "" : ", ") + std::string(c->name());
  return s;
}

}  // namespace

const char* wire_name(Wire w) {
  const size_t i = static_cast<size_t>(w);
  return i < codecs().size() ? codecs()[i]->name() : "an unknown wire";
}

Wire wire_from_int(int v) {
  PYRING_CHECK_ARG(v >= 0 && static_cast<size_t>(v) < codecs().size(), "wire code ", v,
                   " names no wire (valid: ", valid_names(), ")");
  return static_cast<Wire>(v);
}

const Codec& codec_of(Wire w) {
  return *codecs()[static_cast<size_t>(wire_from_int(static_cast<int>(w)))];
}

Wire wire_named(const std::string& name) {
  for (size_t i = 0; i < codecs().size(); ++i) {
    if (name == codecs()[i]->name()) return static_cast<Wire>(i);
  }
  PYRING_THROW(InvalidArgument, "unknown wire '", name, "' (valid: ", valid_names(), ")");
}

}  // namespace pyring

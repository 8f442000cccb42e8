// defines: first_line(), shape_text(), within_storage() and tensor_past_storage() — what
// partrain checks in values LibTorch's unpickler made from a file's bytes (a tensors data set,
// a checkpoint) before it trusts them. The unpickler takes a tensor's sizes, strides and offset
// from the file as they are; a file whose tensors reach past their storage (cut or made by
// hand: torch.save never writes one) would have their elements read from beyond it.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <string>

namespace partrain::data {

// The text up to its first line break (LibTorch's messages go on with a backtrace).
std::string first_line(const std::string& text);
// "[60, 3, 4, 5]".
std::string shape_text(const at::Tensor& t);
// Whether every element `t`'s sizes and strides reach lies inside its storage.
bool within_storage(const at::Tensor& t);
// Where in `value` (dicts, lists and tuples, however nested) a tensor lies that reaches past
// its storage, as its path of keys and its shape ("model/fc.bias of shape [10]"); empty where
// none does. A value reached twice (the pickle's memo can share one) is looked into once,
// so a file cannot make the walk longer than its own values.
std::string tensor_past_storage(const c10::IValue& value);

}  // namespace partrain::data

#include "core/errors.h"

namespace pyring {

void rethrow_with_prefix(const std::string& prefix) {
  try {
    throw;
  } catch (const TimeoutError& e) {
    throw TimeoutError(prefix + e.what());
  } catch (const CommError& e) {
    throw CommError(prefix + e.what());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(prefix + e.what());
  } catch (const TypeMismatch& e) {
    throw TypeMismatch(prefix + e.what());
  } catch (const DeviceOutOfMemory& e) {
    throw DeviceOutOfMemory(prefix + e.what());
  } catch (const CudaError& e) {
    throw CudaError(prefix + e.what());
  } catch (const Error& e) {
    throw Error(prefix + e.what());
  } catch (const std::exception& e) {
    throw Error(prefix + e.what());
  }
}

}  // namespace pyring

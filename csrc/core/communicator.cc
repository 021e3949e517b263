#include "core/communicator.h"

#include "core/errors.h"
#include "transport/link.h"

namespace pyring {

Communicator::Communicator(int rank, int size, Options options,
                           std::vector<std::unique_ptr<Link>> links,
                           std::shared_ptr<void> keepalive)
    : rank_(rank),
      size_(size),
      options_(options),
      links_(std::move(links)),
      keepalive_(std::move(keepalive)) {
  PYRING_CHECK_ARG(size >= 1 && rank >= 0 && rank < size, "rank ", rank,
                   " out of range for world size ", size);
  links_.resize(static_cast<size_t>(size));
}

Communicator::~Communicator() {
  close();
}

void Communicator::close() {
  engine_.stop("communicator closed");
}

int Communicator::spin_us() const {
  if (ProgressEngine::on_progress_thread() && options_.spin_us > kProgressSpinUs) {
    return kProgressSpinUs;
  }
  return options_.spin_us;
}

bool Communicator::has_link(int peer) const {
  return peer >= 0 && peer < size_ && links_[static_cast<size_t>(peer)] != nullptr;
}

Link& Communicator::link(int peer) {
  PYRING_CHECK(has_link(peer), CommError, "missing connection between rank ", rank_,
               " (this process) and rank ", peer);
  return *links_[static_cast<size_t>(peer)];
}

uint8_t* Communicator::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void Communicator::execute(const CollectiveDesc& desc, const std::function<void(Deadline)>& fn) {
  auto prefix = [&] { return str_cat(desc.str(), " on rank ", rank_, "/", size_, ": "); };
  if (!broken_.empty()) {
    PYRING_THROW(CommError, prefix(),
                 "communicator is unusable after an earlier failure: ", broken_);
  }
  ++seq_;
  try {
    fn(Deadline::after(options_.timeout_s));
  } catch (const CommError& e) {
    broken_ = e.what();
    for (auto& l : links_) {
      if (l) l->abort();
    }
    rethrow_with_prefix(prefix());
  } catch (...) {
    rethrow_with_prefix(prefix());
  }
}

void Communicator::run_sync(const CollectiveDesc& desc, const std::function<void(Deadline)>& fn) {
  engine_.run_sync(desc, [this, &desc, &fn] { execute(desc, fn); });
}

std::shared_ptr<Work> Communicator::submit(const CollectiveDesc& desc,
                                           std::function<void(Deadline)> fn) {
  return engine_.submit(desc, [this, desc, fn = std::move(fn)] { execute(desc, fn); });
}

}  // namespace pyring

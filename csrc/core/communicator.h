// The Communicator: this rank's place in the job, its links, options and progress engine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/progress.h"
#include "core/types.h"

namespace pyring {

class Link;

enum class Algo : int { kAuto = 0, kRing = 1, kDirect = 2 };

struct Options {
  Algo algo = Algo::kAuto;
  double timeout_s = 300.0;          // deadline of every collective, counted from its start
  size_t segment_bytes = 256 << 10;  // pipelining unit; shm slot and tcp staging size
  int spin_us = 50;                  // how long a waiting rank polls before it sleeps
};

class Communicator {
 public:
  // `links` is indexed by rank; null where no link exists (always at this rank). `keepalive`
  // holds transport state the links share (shared-memory segments).
  Communicator(int rank, int size, Options options, std::vector<std::unique_ptr<Link>> links,
               std::shared_ptr<void> keepalive);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  // How long a waiting collective polls before it sleeps: options().spin_us on the caller's
  // thread, at most kProgressSpinUs on the progress thread, where polling would take the core
  // from the caller's compute (backward) that the collective is meant to overlap.
  static constexpr int kProgressSpinUs = 20;
  int spin_us() const;
  int size() const { return size_; }
  const Options& options() const { return options_; }

  // Throws CommError naming both ranks when there is no link to `peer`.
  Link& link(int peer);
  bool has_link(int peer) const;
  Link& left() { return link((rank_ + size_ - 1) % size_); }
  Link& right() { return link((rank_ + 1) % size_); }

  // Runs `fn(deadline)` as one collective described by `description`, on this thread when
  // nothing else is queued. Errors are rethrown with the description and this rank prefixed;
  // a CommError aborts every link and leaves the communicator unusable.
  void run_sync(const CollectiveDesc& desc, const std::function<void(Deadline)>& fn);
  std::shared_ptr<Work> submit(const CollectiveDesc& desc, std::function<void(Deadline)> fn);

  // Scratch memory for the collective that runs now; valid until the next call.
  uint8_t* scratch(size_t bytes);

  // Stops the progress engine (queued work fails with CommError). Idempotent.
  void close();
  bool broken() const { return !broken_.empty(); }
  // The sequence number of the collective running now (1 for the first).
  uint64_t seq() const { return seq_; }

 private:
  void execute(const CollectiveDesc& desc, const std::function<void(Deadline)>& fn);

  int rank_;
  int size_;
  Options options_;
  std::vector<std::unique_ptr<Link>> links_;
  std::shared_ptr<void> keepalive_;
  std::vector<uint8_t> scratch_;
  uint64_t seq_ = 0;    // written only by the running collective
  std::string broken_;  // why the communicator is unusable; written only by the running collective
  ProgressEngine engine_;  // last: its thread stops before the links go away
};

}  // namespace pyring

// Point-to-point messages, on a second set of links to every peer (the p2p links), apart from
// the collectives' links: a message never waits behind a collective, nor a collective behind
// a message.
//
// Contract:
// - On the wire each message is a P2pFrame and then its payload. Frames from a peer are matched
//   in arrival order against the receives in posting order, by (context, tag) and source (-1:
//   any source), so messages from one rank with one tag arrive in the order they were sent.
// - A message that arrives before a matching receive is posted is held in memory (its size)
//   until one is; a sender therefore never waits for its receiver to post.
// - A send completes once its bytes have left for the peer; the caller may then reuse its
//   buffer. A receive completes once the payload is in its buffer; its size must equal the
//   message's, else the receive fails naming both (the payload is discarded).
// - The p2p thread drives the links while anything may move; a thread waiting on a p2p work
//   drives them itself while it spins, so a waiting pair of ranks needs no wake-up.
// - An op still pending at its deadline fails with TimeoutError naming the peer and the tag. A
//   send that times out, and any error on a link, break the link to that peer: later ops with
//   that peer fail with CommError.
// - A peer has failed when its link broke other than after it closed its engine cleanly (close()
//   sends each working peer a kClosing frame first; a rank that announced an abort sends none).
//   A receive from any source fails with CommError naming the failed peer, at once if it is
//   pending then, and at its posting after that unless a message that arrived whole matches
//   it: no message from that peer can come, and the receive cannot tell whether one would have
//   (ULFM's rule for MPI_ANY_SOURCE, without its acknowledgement).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/callbacks.h"
#include "core/link.h"
#include "core/types.h"
#include "core/work.h"

namespace pyring {

// Whose message it is: the user's, or part of a collective (tag = the collective's sequence
// number, kind = its CollectiveKind), so that the two never match each other.
// kControl: a message from the engine itself (kind kAbortCause: why the sender's communicator
// gave up), which no receive matches.
enum class P2pContext : uint8_t { kUser = 0, kCollective = 1, kControl = 2 };
constexpr uint8_t kAbortCause = 1;
constexpr uint8_t kClosing = 2;  // kControl, no payload: the sender's engine closes cleanly

struct P2pFrame {
  uint32_t magic;
  uint8_t context;
  uint8_t kind;
  uint16_t reserved;
  int64_t tag;
  uint64_t bytes;
  uint64_t reserved2;
};
static_assert(sizeof(P2pFrame) == 32, "P2pFrame is part of the wire format");

struct P2pAddress {
  int peer;  // a rank; for receives -1 means any source
  int64_t tag;
  P2pContext context = P2pContext::kUser;
  uint8_t kind = 0;
};

class P2pEngine : public std::enable_shared_from_this<P2pEngine> {
 public:
  // `links` is indexed by rank (null at this rank); `keepalive` holds their shm segments.
  P2pEngine(int rank, std::vector<std::unique_ptr<Link>> links, std::shared_ptr<void> keepalive,
            int spin_us);
  ~P2pEngine();  // close()s
  P2pEngine(const P2pEngine&) = delete;
  P2pEngine& operator=(const P2pEngine&) = delete;

  // Starts the p2p thread; called once, after construction through make_shared.
  void start();

  // Queue an op; the work completes as described above. `data` stays valid until then.
  // `helped`: the caller waits on the work at once (its wait drives the links), so the p2p
  // thread is not woken for it. Thread-safe. Throw InvalidArgument for a peer out of range or this
  // rank, CommError when the link to the peer is broken or the engine is closed.
  std::shared_ptr<Work> send(const void* data, size_t bytes, const P2pAddress& to,
                             Deadline deadline, bool helped);
  std::shared_ptr<Work> recv(void* data, size_t bytes, const P2pAddress& from, Deadline deadline,
                             bool helped);

  // Drives the links on this thread, sleeping on them when idle, until every work in `works`
  // has completed or failed (their deadlines bound it): a collective's wait, with no hand-off
  // to the p2p thread.
  void wait_all(const std::vector<std::shared_ptr<Work>>& works);
  // The same until done() (called between passes, without the engine's lock: it may post)
  // returns true.
  void drive_until_done(const std::function<bool()>& done) { drive_until(done, true); }

  // Sends `cause` (why this rank's communicator gave up) to every peer whose link works, as a
  // kControl message; returns at once. The first call's cause is the one sent.
  void announce_abort(const std::string& cause);
  // The cause `peer` announced, waiting up to `wait` for it to arrive; "" if none came.
  std::string announced_by(int peer, std::chrono::milliseconds wait);

  // Fails every pending op with CommError(why) and stops the thread. Idempotent.
  void close(const std::string& why);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }
  uint64_t bytes_sent() const;
  uint64_t bytes_received() const;

 private:
  struct Op;
  struct Held;
  struct Peer {
    Link* link = nullptr;
    std::string broken;         // why the link is unusable; empty while it works
    bool gave_up = false;       // its abort cause has arrived: no more collective data comes
    bool said_goodbye = false;  // its kClosing frame has arrived
    P2pFrame incoming{};
    uint64_t posted_bytes = 0;                // frames and payloads queued for sending, ever
    std::deque<std::shared_ptr<Op>> sends;    // in posting order
    std::deque<std::shared_ptr<Op>> landing;  // receives whose message arrives from this peer
  };

  std::shared_ptr<Work> make_work(const char* name, size_t bytes, const P2pAddress& a);
  // The caller holds mu_ in all the *_locked functions.
  bool progress_locked();
  void post_frame_recv_locked(int peer);
  void on_frame_locked(int peer);
  std::exception_ptr check_locked(int peer, const std::shared_ptr<Op>& op, const P2pFrame& f);
  void land_locked(int peer, const std::shared_ptr<Op>& op, const P2pFrame& f);
  void hold_locked(int peer, const P2pFrame& f);
  void expire_locked();
  // Breaks the links to peers known to be dead or gone, and expires ops past their deadline.
  void check_peers_locked();
  void break_peer_locked(int peer, const std::string& why);
  // `peer` announced that it gave up: it sends no more collective data, so this rank's
  // collective receives from it fail with PeerLost (gave_up), whose handler relays the cause
  // held beside them instead of waiting out the deadline.
  void fail_collective_recvs_locked(int peer);
  // The failure of `peer` (Peer::broken), for receives from any source; null while it has not
  // failed (its link works, or it closed cleanly).
  std::exception_ptr failed_for_any_source_locked(int peer, const P2pAddress& a);
  // Sends kClosing to every working peer and drives the links until it has left, for at most
  // kGoodbyeTime; close()'s, after it failed the pending ops.
  void say_goodbye_locked();
  void finish_locked(const std::shared_ptr<Op>& op, std::exception_ptr error);
  // Whether every live link finds polling for spin_us worthwhile (Link::spin_worthwhile).
  bool spin_worthwhile_locked();
  // Completes p's sends whose bytes have all left (Link::bytes_sent).
  void finish_sent_locked(Peer& p);
  // Spins driving the links until `w` completes or spin_us passes; Work::wait's helper.
  void help(const Work& w);
  // Drives until done(); after spin_us without progress, stops unless `to_the_end`, in which
  // case it sleeps on the links and goes on (at once when polling is not worthwhile).
  void drive_until(const std::function<bool()>& done, bool to_the_end);
  void loop();
  // Waits on idle_cv_ for kParkTime, or until a post nobody helps or close().
  void park();
  void block();
  void wake();

  const int rank_;
  const int spin_us_;
  std::vector<std::unique_ptr<Link>> links_;
  std::shared_ptr<void> keepalive_;
  std::shared_ptr<CallbackRunner> runner_ = std::make_shared<CallbackRunner>();

  std::mutex mu_;
  std::vector<Peer> peers_;                // guarded by mu_
  std::list<std::shared_ptr<Op>> recvs_;   // posted, unmatched; guarded by mu_
  std::list<std::shared_ptr<Held>> held_;  // arrived, unclaimed; guarded by mu_
  size_t in_flight_ = 0;                   // ops not yet finished; guarded by mu_
  std::string closed_;                     // guarded by mu_
  Clock::time_point last_expire_{};        // guarded by mu_
  uint64_t passes_ = 0;                    // progress passes; guarded by mu_

  std::atomic<int> helpers_{0};  // threads driving in help()
  std::atomic<bool> helped_since_park_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  int event_fd_ = -1;
  std::atomic<uint32_t>* sleep_word_ = nullptr;  // this rank's p2p shm futex word, if any
  std::mutex idle_mu_;
  std::condition_variable idle_cv_;  // the thread waits here while helpers drive
  bool parked_ = false;              // the thread waits on idle_cv_; guarded by idle_mu_
  bool unhelped_ = false;            // a post or a leaving helper needs the thread; idle_mu_
  std::string abort_cause_;          // what announce_abort sent; set once, guarded by mu_
  P2pFrame goodbye_{};               // the kClosing frame close() sends; guarded by mu_
  std::thread thread_;
};

}  // namespace pyring

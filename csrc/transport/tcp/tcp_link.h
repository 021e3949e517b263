// A Link to a peer over one authenticated, non-blocking TCP connection.
#pragma once

#include <deque>
#include <vector>

#include "core/link.h"

namespace pyring {

class TcpLink : public Link {
 public:
  // Takes ownership of the connected socket `fd`. Pieces of receives without copy_to are
  // delivered in `staging_bytes` units (a multiple of kPieceAlign).
  TcpLink(int peer, int fd, size_t staging_bytes);
  ~TcpLink() override;

  const char* kind() const override { return "tcp"; }
  void post_send(const uint8_t* data, size_t bytes) override;
  void post_recv(RecvSpec spec) override;
  bool progress() override;
  bool idle() const override { return sends_.empty() && recvs_.empty(); }
  bool sending() const override { return !sends_.empty(); }
  std::string pending() const override;
  int poll_fd() const override { return fd_; }
  bool wants_write() const override { return !sends_.empty(); }
  void check_peer() override {}
  void abort() override;

 private:
  struct Send {
    const uint8_t* data;
    size_t bytes;
    size_t done;
  };
  struct Recv {
    RecvSpec spec;
    size_t done;      // bytes delivered to on_piece / copy_to
    size_t received;  // bytes read from the socket (>= done)
  };
  bool progress_send();
  bool progress_recv();
  [[noreturn]] void fail(const char* what, int err);

  int fd_;
  std::vector<uint8_t> staging_;
  size_t staged_ = 0;
  std::deque<Send> sends_;
  std::deque<Recv> recvs_;
  bool aborted_ = false;
};

}  // namespace pyring

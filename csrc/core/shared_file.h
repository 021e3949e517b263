// Unnamed shared memory for the ranks of one host: an anonymous file (memfd, mode 0600) that
// local peers open through /proc/PID/fd/FD while the process that made it holds its descriptor.
// It has no name in any file system, so however its processes end (SIGKILL included) nothing is
// left behind: the pages go with the last mapping. Ranks that open each other's files share a
// pid namespace and run as one user (the host key, pyring/runtime/rendezvous.py, makes the
// first so; the second is the user's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pyring {

// What a peer needs to open the file: the process holding it, its descriptor there, and the
// file's inode, which the opener checks (a descriptor number reused for another file fails).
struct SharedFileId {
  int32_t pid = 0;
  int32_t fd = -1;
  uint64_t ino = 0;

  // "pid:fd:ino", the form a transport publishes.
  std::string str() const;
  // Throws CommError naming `s` where it is not that form.
  static SharedFileId parse(const std::string& s);
};

class SharedFile {
 public:
  // Makes the file, empty; `label` shows in /proc/PID/maps as /memfd:LABEL. Throws CommError.
  explicit SharedFile(std::string label);
  ~SharedFile();
  SharedFile(const SharedFile&) = delete;
  SharedFile& operator=(const SharedFile&) = delete;

  const std::string& label() const { return label_; }
  const SharedFileId& id() const { return id_; }
  // Sizes the file to `bytes` and maps all of it, populated (so no collective takes the page
  // faults of a first write). The mapping outlives this object; munmap it. Throws CommError
  // naming the label and the call that failed.
  uint8_t* map(size_t bytes);
  // Peers can no longer open the file (the descriptor is closed); mappings stay. Idempotent.
  void close();

 private:
  std::string label_;
  SharedFileId id_;
};

// The label of rank `rank`'s file for `channel` of job `job`: "pyring-JOB-RANK[-CHANNEL]".
std::string shared_file_label(const std::string& job, int rank, const std::string& channel);

// Maps `bytes` of the file `id` names (a local peer's, whose process must still hold it),
// populated. Throws CommError beginning with `what` (whose file it is) and saying why.
uint8_t* map_shared_file(const std::string& what, const SharedFileId& id, size_t bytes);

}  // namespace pyring

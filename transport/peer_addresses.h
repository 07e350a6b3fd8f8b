// Which rank is "[127.0.0.1]:40123"? Gloo's tcp errors name the remote end
// of a connection by address only. After connectFullMesh this finds, for
// every peer rank, the address string Gloo uses for that connection, so
// GlooComm can add "(peer ADDR is rank R)" to its messages.
#pragma once

#include <string>
#include <vector>

namespace compcoll {

class RendezvousStore;

// For pair (rank, i), Gloo prints one of two addresses, depending on which
// side opened the connection: i's published listening address for the pair
// (when we connected to it), or the remote end of the socket we accepted on
// our own published address (when i connected to us). Both are collected;
// entries are "" where nothing is known. Never throws: this only decorates
// error messages.
std::vector<std::vector<std::string>> discover_peer_addresses(
    RendezvousStore& store, int rank, int size);

// " (peer ADDR is rank R)" for every address of `addresses` (indexed by
// rank, as discover_peer_addresses returns) that `msg` mentions; "" if none.
std::string name_peer_addresses(const std::string& msg,
                                const std::vector<std::vector<std::string>>& addresses);

}  // namespace compcoll

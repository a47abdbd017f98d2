# Sourced: debian_mirror prints the Debian mirror of this machine's apt sources (deb822 or
# one-line format), or nothing when there is none.
debian_mirror() {
  local url
  url=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2> /dev/null || true)
  [[ -n $url ]] || url=$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2> /dev/null || true)
  echo "${url%/}"
}

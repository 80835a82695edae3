# a jump past the end
#@ type kprobe
#@ intent reject
mov %r0, 0
ja +5
exit

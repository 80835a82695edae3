# a helper told to write 32 bytes into a 16-byte buffer at the top
#@ type kprobe
#@ intent reject
mov %r1, %r10
add %r1, -16
mov %r2, 32
call 16
mov %r0, 0
exit

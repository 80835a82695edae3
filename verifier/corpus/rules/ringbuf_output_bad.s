# ringbuf_output of 32 bytes from a 16-byte area at the frame's top
#@ type kprobe
#@ intent reject
#@ map rb ringbuf 0 0 4096
stdw [%r10-16], 1
stdw [%r10-8], 2
ldmap %r1, rb
mov %r2, %r10
add %r2, -16
mov %r3, 32
mov %r4, 0
call 130
mov %r0, 0
exit

# ringbuf_output of 16 initialised stack bytes
#@ type kprobe
#@ intent accept
#@ map rb ringbuf 0 0 4096
stdw [%r10-16], 1
stdw [%r10-8], 2
ldmap %r1, rb
mov %r2, %r10
add %r2, -16
mov %r3, 16
mov %r4, 0
call 130
mov %r0, 0
exit

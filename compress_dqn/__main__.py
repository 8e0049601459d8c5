from compress_dqn.cli import main

main()

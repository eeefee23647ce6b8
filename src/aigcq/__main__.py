from aigcq.cli.app import main

main()
